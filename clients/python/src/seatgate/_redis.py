"""The Redis transport (docs/protocol.md, "Writing a client"): requests
XADDed on one connection (whatever has piled up goes as one pipeline),
replies read by one loop on a connection of its own from the client's reply
stream, and handed to the request waiting under the reply's ``id``.

Shutdown always ends: the reply loop checks a stop flag after every read
(a cancelled blocking XREAD in redis-py can return an empty result instead
of raising), and close() drops the reader's connection under its blocked
XREAD rather than waiting for the block to end.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ._backend import AcquireSpec, Logger, SeatTarget, Timing
from .errors import CLOSED, OUT_OF_MEMORY, REDIS_UNAVAILABLE, TIMEOUT, SeatgateError, describe, is_out_of_memory
from .wire import (
    DEDUPE_WINDOW_MS,
    REQUEST_EXPIRED,
    RETRY_LATER,
    Inbox,
    Received,
    Reply,
    entry_ms,
    fields_of,
    new_lease,
    now_ms,
    random_hex,
    shard_of,
    sleep_ms,
)

#: How long one XREAD blocks. The loop is ended by dropping its connection,
#: so this only bounds how long a silent connection goes unnoticed.
READ_BLOCK_MS = 5000
#: Most XADDs per pipeline.
WRITE_BATCH = 512
#: Attempts of one request whose replies are still awaited (a release keeps all).
ATTEMPTS_KEPT = 4
#: An XADD that failed ambiguously (the connection broke before it was
#: answered) is sent again under the same id for at most this long after its
#: first attempt: well within the service's dedupe window.
SAME_ID_FOR_MS = DEDUPE_WINDOW_MS / 2

#: Errors of Redis's connection, after which an XADD may or may not have landed.
_AMBIGUOUS = (redis.ConnectionError, redis.TimeoutError, OSError, asyncio.TimeoutError)


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        u = urlsplit(url)
        netloc = u.netloc
        if "@" in netloc:
            auth, host = netloc.rsplit("@", 1)
            if ":" in auth:
                user = auth.split(":", 1)[0]
                netloc = f"{user}:***@{host}"
        return urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment)).rstrip("/")
    except ValueError:
        return "(an invalid URL)"


def url_has_password(url: str) -> bool:
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return False


@dataclass(frozen=True)
class SentinelOptions:
    """Sentinel mode: the master is whichever node the Sentinels name."""

    #: The Sentinels' (host, port) addresses, asked in turn.
    addresses: Tuple[Tuple[str, int], ...]
    #: The name the Sentinels monitor the master by (``sentinel monitor <name> ...``).
    master_name: str
    #: The Sentinels' own login (``requirepass`` / ACL in sentinel.conf), if any.
    username: Optional[str]
    password: Optional[str]


#: A Sentinel's address as the caller gives it: (host, port) or "host:port".
SentinelAddress = Union[Tuple[str, int], str]


def sentinel_addresses(sentinels: Sequence[SentinelAddress]) -> Tuple[Tuple[str, int], ...]:
    """(host, port) pairs of (host, port) tuples or "host:port" strings;
    raises ValueError naming the first that is neither."""
    out: List[Tuple[str, int]] = []
    for s in sentinels:
        if isinstance(s, str):
            host, sep, port_text = s.rpartition(":")
            port = int(port_text) if sep and port_text.isdigit() else 0
        else:
            host, port = (s[0], s[1]) if isinstance(s, (tuple, list)) and len(s) == 2 else ("", 0)
        host = host.strip("[]") if isinstance(host, str) else ""
        if not host or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"a Sentinel is (host, port) or \"host:port\", not {s!r}")
        out.append((host, port))
    if not out:
        raise ValueError("sentinels names no Sentinel")
    return tuple(out)


@dataclass(frozen=True)
class RedisOptions:
    #: The Redis URL ("" in Sentinel mode).
    url: str
    application: Optional[str]
    username: Optional[str]
    password: Optional[str]
    key_prefix: str
    connect_timeout_ms: float
    max_in_flight: int
    shards: Optional[int]
    timing: Timing
    log: Logger
    #: Sentinel mode (then `url` is unused).
    sentinel: Optional[SentinelOptions] = None

    @property
    def where(self) -> str:
        """What the client talks to, for messages (no password)."""
        if self.sentinel is None:
            return f"Redis at {safe_url(self.url)}"
        addrs = ", ".join(f"{h}:{p}" for h, p in self.sentinel.addresses)
        return f"the Redis master {self.sentinel.master_name!r} of the Sentinels at {addrs}"


@dataclass
class Topology:
    """What the workers record in ``<prefix>:config`` (docs/protocol.md,
    "Shards and Redis Cluster")."""

    shards: int
    requests: str
    applications: List[str]
    replies_prefix: str


@dataclass
class _Waiter:
    inbox: Inbox[Received]
    #: Whether it still holds an in-flight slot (until its first reply).
    holds_slot: bool = True


@dataclass
class _Out:
    """One XADD to send (again)."""

    request_id: str
    license: str
    fields: Dict[str, str]
    first_ms: float = field(default_factory=now_ms)
    failures: int = 0


def _sentinels(opts: RedisOptions) -> Any:
    """In Sentinel mode, redis-py's Sentinel manager (the Sentinels' own
    connections, which find the master), shared by both connections' pools;
    else None."""
    if opts.sentinel is None:
        return None
    from redis.asyncio import sentinel as aiosentinel

    timeout = opts.connect_timeout_ms / 1000.0
    kwargs: Dict[str, Any] = {
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    if opts.sentinel.username is not None:
        kwargs["username"] = opts.sentinel.username
    if opts.sentinel.password is not None:
        kwargs["password"] = opts.sentinel.password
    manager: Any = aiosentinel.Sentinel
    return manager(list(opts.sentinel.addresses), sentinel_kwargs=kwargs)


async def _close_sentinels(sentinels: Any) -> None:
    if sentinels is None:
        return
    for s in sentinels.sentinels:
        try:
            await asyncio.wait_for(_close_client(s), 0.3)
        except BaseException:
            pass


def _pool(opts: RedisOptions, blocking: bool, socket_timeout: Optional[float], sentinels: Any = None) -> Any:
    """A pool of one connection. The package retries by itself: redis-py's
    own retries are off (a retried blocking XREAD would outlive close()).

    In Sentinel mode a SentinelConnectionPool of `sentinels`: each
    connection asks the Sentinels for the master when it connects (again
    after the master's connection dropped, or it answered READONLY), so
    both connections follow a failover. The requests' pool is not a
    blocking one there (redis-py has no blocking Sentinel pool): a topology
    read during a pipeline opens a second connection."""
    kwargs: Dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": opts.connect_timeout_ms / 1000.0,
        "socket_timeout": socket_timeout,
        "retry": Retry(NoBackoff(), 0),
        "max_connections": 1,
    }
    if opts.username is not None:
        kwargs["username"] = opts.username
    if opts.password is not None:
        kwargs["password"] = opts.password
    if opts.sentinel is not None:
        from redis.asyncio import sentinel as aiosentinel

        if blocking:
            del kwargs["max_connections"]
        pool_class: Any = aiosentinel.SentinelConnectionPool  # untyped in redis-py 4.x
        return pool_class(opts.sentinel.master_name, sentinels, **kwargs)
    if blocking:
        return aioredis.BlockingConnectionPool.from_url(opts.url, timeout=None, **kwargs)
    return aioredis.ConnectionPool.from_url(opts.url, **kwargs)


async def _close_client(r: Any) -> None:
    """Closes a redis.asyncio client and its pool. redis-py 5 names it
    aclose(); 4.x only has close()."""
    closer = getattr(r, "aclose", None) or r.close
    try:
        await closer()
    finally:
        await r.connection_pool.disconnect(inuse_connections=True)


class RedisTransport:
    """Requests on one connection, replies on another: see the module's doc."""

    def __init__(self, opts: RedisOptions, writer: Any, topology: Topology, sentinels: Any = None) -> None:
        self._opts = opts
        self.where = opts.where
        self._sentinels = sentinels
        self._writer = writer
        self._topology = topology
        self._topology_read_at = now_ms()
        app = opts.application if opts.application is not None else "python"
        #: The stream replies come back on: ``<replies_prefix><app>:<random>``.
        self.reply_to = f"{topology.replies_prefix}{app}:{random_hex(16)}"
        # The reader's socket timeout must outlast its block: a shorter one
        # would abort a read the server still answers.
        self._reader: Any = aioredis.Redis(
            connection_pool=_pool(opts, False, READ_BLOCK_MS / 1000.0 + 5, sentinels)
        )
        self._waiters: Dict[str, _Waiter] = {}
        self._id_prefix = random_hex(8)
        self._counter = 0
        self._closing = False
        self._slots = asyncio.Semaphore(opts.max_in_flight)
        self._outbox: asyncio.Queue[_Out] = asyncio.Queue()
        self._last_error = ""
        #: Whether Redis refused the last batch of requests with OOM (until one is sent).
        self.out_of_memory = False
        #: Counters for the curious: pipelines written, the most requests in
        #: flight at once, replies without a waiter, read retries.
        self.stats: Dict[str, int] = collections.Counter()
        self._read_task: Optional[asyncio.Task[None]] = None
        self._write_task: Optional[asyncio.Task[None]] = None
        self._refreshing: Optional[asyncio.Task[None]] = None

    @classmethod
    async def connect(cls, opts: RedisOptions) -> "RedisTransport":
        """Connects and reads the service's topology; raises REDIS_UNAVAILABLE
        naming Redis when it cannot."""
        writer: Any = None
        sentinels: Any = None
        try:
            sentinels = _sentinels(opts)
            # Requests: a command Redis does not answer (frozen, failing over)
            # is given up on after a while; the seat handle has sent it again
            # by then.
            timeout = max(opts.timing.request_timeout_ms * 2, 1000) / 1000.0
            writer = aioredis.Redis(connection_pool=_pool(opts, True, timeout, sentinels))
            # Sentinel mode: the Sentinels are asked, then the master.
            within = opts.connect_timeout_ms * (1 if sentinels is None else 2) / 1000.0
            topology = await asyncio.wait_for(read_topology(writer, opts), within)
        except BaseException as e:
            if writer is not None:
                try:
                    await asyncio.wait_for(_close_client(writer), 0.5)
                except BaseException:
                    pass
            await _close_sentinels(sentinels)
            if isinstance(e, SeatgateError) or not isinstance(e, Exception):
                raise
            why = "no answer" if isinstance(e, asyncio.TimeoutError) else describe(e)
            raise SeatgateError(REDIS_UNAVAILABLE, f"cannot connect to {opts.where}: {why}") from e
        t = cls(opts, writer, topology, sentinels)
        t._read_task = asyncio.ensure_future(t._read_loop())
        t._write_task = asyncio.ensure_future(t._write_loop())
        return t

    @property
    def timing(self) -> Timing:
        return self._opts.timing

    @property
    def is_closing(self) -> bool:
        return self._closing

    def _note_error(self, which: str, e: BaseException) -> None:
        if self._closing:
            return
        text = describe(e)
        if text != self._last_error:
            self._opts.log("warn", f"{self.where} ({which} connection): {text}")
        self._last_error = text

    def _stream_for(self, license: str) -> str:
        """The requests stream (shard) a request about `license` goes to."""
        t = self._topology
        app = self._opts.application
        base = f"{t.requests}:app:{app}" if app is not None and app in t.applications else t.requests
        shards = self._opts.shards if self._opts.shards is not None else t.shards
        return shard_of(base, shards, license)

    def before_resend(self) -> None:
        """Reads the topology again before a re-send (an operator may have
        changed the shard count), at most once a second, in the background."""
        if now_ms() - self._topology_read_at < 1000 or self._refreshing is not None:
            return
        self._topology_read_at = now_ms()

        async def refresh() -> None:
            try:
                self._topology = await asyncio.wait_for(read_topology(self._writer, self._opts), 5.0)
            except Exception:
                pass  # Redis away: keep the last one
            finally:
                self._refreshing = None

        self._refreshing = asyncio.ensure_future(refresh())

    def in_flight(self) -> int:
        """Requests sent (or about to be) and not answered yet."""
        return sum(1 for w in self._waiters.values() if w.holds_slot)

    async def send(self, op: str, license: str, session: str, fields: Dict[str, str], inbox: Inbox[Received]) -> str:
        """Sends one request once an in-flight slot is free: registers
        `inbox` under a new id before the XADD (the reply can be read before
        the XADD's own answer), then queues the XADD. A failed XADD is sent
        again under the same id while that is safe, else only logged: the
        caller sends again after its request timeout. Returns the id."""
        if self._closing:
            raise SeatgateError(CLOSED, "the seatgate client is closed")
        await self._slots.acquire()
        if self._closing:
            self._slots.release()
            raise SeatgateError(CLOSED, "the seatgate client is closed")
        self._counter += 1
        request_id = f"{self._id_prefix}-{self._counter}"
        self._waiters[request_id] = _Waiter(inbox)
        self.stats["most_in_flight"] = max(self.stats["most_in_flight"], self.in_flight())
        entry = {"op": op, "id": request_id, "license": license, "session": session, "reply_to": self.reply_to}
        entry.update(fields)
        self._outbox.put_nowait(_Out(request_id, license, entry))
        return request_id

    def forget(self, request_id: str) -> None:
        """Stops handing replies for `request_id` to anyone."""
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and waiter.holds_slot:
            waiter.holds_slot = False
            self._slots.release()

    async def _write_loop(self) -> None:
        """Sends queued XADDs, as many as have piled up, in one pipeline;
        never ends but at close (were it to, every request would go unsent)."""
        while not self._closing:
            try:
                await self._write_batches()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug, not Redis: keep writing
                self._opts.log("warn", f"the request writer failed ({describe(e)}); going on")
                await asyncio.sleep(0.1)

    async def _write_batches(self) -> None:
        backoff = 0.05
        while not self._closing:
            batch = [await self._outbox.get()]
            while len(batch) < WRITE_BATCH and not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            # One whose caller stopped waiting need not go.
            batch = [out for out in batch if out.request_id in self._waiters]
            if not batch:
                continue
            pipe = self._writer.pipeline(transaction=False)
            for out in batch:
                pipe.xadd(self._stream_for(out.license), out.fields)
            results: List[Any]
            try:
                results = list(await pipe.execute(raise_on_error=False))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # The connection failed: every XADD of the batch failed, and
                # some may have landed.
                results = [e] * len(batch)
            if self._closing:
                return
            self.stats["pipelines"] += 1
            self.out_of_memory = any(is_out_of_memory(r) for r in results if isinstance(r, BaseException)) and all(
                isinstance(r, BaseException) for r in results
            )
            failed = False
            for out, result in zip(batch, results):
                if not isinstance(result, BaseException):
                    continue
                failed = True
                self._note_error("requests", result)
                op = out.fields.get("op", "")
                what = f"{op} for {out.license}/{out.fields.get('session', '')}"
                if (
                    isinstance(result, _AMBIGUOUS)
                    and out.request_id in self._waiters
                    and now_ms() - out.first_ms < SAME_ID_FOR_MS
                ):
                    # Maybe it landed, maybe not: the same request under the
                    # same id is decided once either way (the dedupe window).
                    out.failures += 1
                    delay = min(0.05 * 2 ** min(out.failures, 5), 1.0)
                    asyncio.get_running_loop().call_later(delay, self._requeue, out)
                else:
                    self._opts.log("warn", f"cannot send {what} to {self.where} ({describe(result)}); trying again")
            if failed:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            else:
                backoff = 0.05

    def _requeue(self, out: _Out) -> None:
        if not self._closing and out.request_id in self._waiters:
            self._outbox.put_nowait(out)

    async def _read_loop(self) -> None:
        """XREAD BLOCK from the last id read, each entry to its waiter."""
        last = "0-0"  # the stream is new and ours alone
        backoff = 0.05
        while not self._closing:
            try:
                result = await self._reader.xread({self.reply_to: last}, count=500, block=READ_BLOCK_MS)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self._closing:
                    return
                self.stats["read_retries"] += 1
                self._note_error("replies", e)
                self._opts.log("debug", f"cannot read replies from {self.where} ({describe(e)}); reading again from {last}")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            # A cancelled read can return nothing instead of raising: the
            # flag, not the result, says whether to go on.
            if self._closing:
                return
            try:
                entries = _entries(result)
            except (TypeError, ValueError, IndexError, AttributeError) as e:
                self._opts.log("warn", f"an XREAD answer from {self.where} not understood ({describe(e)})")
                continue
            for entry_id, flat in entries:
                last = entry_id
                reply = fields_of(flat)
                waiter = self._waiters.get(reply.get("id", ""))
                if waiter is None:
                    # Late (its caller gave up) or a repeat.
                    self.stats["unclaimed"] += 1
                    continue
                if waiter.holds_slot:
                    waiter.holds_slot = False
                    self._slots.release()
                waiter.inbox.push(Received(reply, entry_ms(entry_id)))

    def start_acquire(self, spec: AcquireSpec) -> "_AcquireAttempt":
        lease = spec.lease if spec.lease is not None else new_lease()
        fields: Dict[str, str] = {"lease": lease, "ttl_ms": str(self._opts.timing.ttl_ms)}
        if spec.user is not None:
            fields["user"] = spec.user
        if spec.group is not None:
            fields["group"] = spec.group
        if spec.priority:
            fields["priority"] = str(spec.priority)
        if spec.borrow_ms:
            fields["borrow_ms"] = str(spec.borrow_ms)
        if spec.meta is not None:
            fields["meta"] = json.dumps(spec.meta, separators=(",", ":"))
        if spec.wait_ms > 0:
            fields["wait_ms"] = str(spec.wait_ms)
        return _AcquireAttempt(lease, _Exchange(self, "acquire", spec.license, spec.session, fields, ATTEMPTS_KEPT))

    def _seat_fields(self, target: SeatTarget) -> Dict[str, str]:
        return {"lease": target.lease, "ttl_ms": str(self._opts.timing.ttl_ms)}

    async def heartbeat(
        self, target: SeatTarget, stop: Optional[asyncio.Event], until_ms: Optional[float]
    ) -> Optional[Received]:
        ex = _Exchange(self, "heartbeat", target.license, target.session, self._seat_fields(target), ATTEMPTS_KEPT)
        try:
            return await ex.answer(until_ms, stop)
        except SeatgateError as e:
            if e.code == TIMEOUT:
                return None
            raise
        finally:
            ex.close()

    async def release(self, target: SeatTarget, until_ms: float) -> Optional[Reply]:
        # Every attempt is listened to: a frozen Redis decides them all at
        # once, the first RELEASED and the rest SESSION_NOT_FOUND.
        ex = _Exchange(self, "release", target.license, target.session, self._seat_fields(target), None)
        try:
            while True:
                try:
                    got = await ex.answer(until_ms)
                except SeatgateError as e:
                    if e.code == TIMEOUT:
                        return None
                    raise
                if got is None:
                    return None
                if got.reply.get("status", "") not in RETRY_LATER:
                    return got.reply
                if now_ms() >= until_ms:
                    return None
                await sleep_ms(max(10.0, self._opts.timing.request_timeout_ms / 5))
                await ex.send()
        finally:
            ex.close()

    async def close(self) -> None:
        """Ends both connections; the blocked read returns with them."""
        if self._closing:
            return
        self._closing = True
        for waiter in self._waiters.values():
            waiter.inbox.close()
        self._waiters.clear()
        # Callers waiting for a slot see the flag.
        for _ in range(self._opts.max_in_flight):
            self._slots.release()
        if self._write_task is not None:
            self._write_task.cancel()
        if self._refreshing is not None:
            self._refreshing.cancel()
        # The reply stream goes now (best effort: an idle one expires by itself).
        dropping = asyncio.ensure_future(self._writer.delete(self.reply_to))
        # The blocking read's connection is dropped under it, not waited for.
        try:
            await asyncio.wait_for(self._reader.connection_pool.disconnect(inuse_connections=True), 0.5)
        except BaseException:
            pass
        if self._read_task is not None:
            done, _ = await asyncio.wait([self._read_task], timeout=0.3)
            if not done:
                self._read_task.cancel()
                await asyncio.wait([self._read_task], timeout=0.2)
        await asyncio.wait([dropping], timeout=0.3)
        if not dropping.done():
            dropping.cancel()
        elif not dropping.cancelled():
            dropping.exception()  # retrieved: a failed delete is no news
        tasks = [t for t in (self._write_task, self._read_task) if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=0.2)
        for r in (self._writer, self._reader):
            try:
                await asyncio.wait_for(_close_client(r), 0.3)
            except BaseException:
                pass
        await _close_sentinels(self._sentinels)


class _Exchange:
    """One request carried through timeouts: every attempt under a new id
    with the same fields (lease and ttl_ms included); a reply to any answers it."""

    def __init__(
        self, t: RedisTransport, op: str, license: str, session: str, fields: Dict[str, str], keep: Optional[int]
    ) -> None:
        self.t, self.op, self.license, self.session, self.fields, self.keep = t, op, license, session, fields, keep
        self.inbox: Inbox[Received] = Inbox()
        self.ids: Deque[str] = collections.deque()
        self.sent = 0
        self.first_sent_at = 0.0
        self.last_sent_at = 0.0

    async def send(self) -> None:
        now = now_ms()
        if self.sent == 0:
            self.first_sent_at = now
        else:
            self.t.before_resend()
        self.last_sent_at = now
        self.sent += 1
        request_id = await self.t.send(self.op, self.license, self.session, self.fields, self.inbox)
        self.ids.append(request_id)
        while self.keep is not None and len(self.ids) > self.keep:
            self.t.forget(self.ids.popleft())

    async def next(self, until_ms: float, stop: Optional[asyncio.Event] = None) -> Optional[Received]:
        """The next reply to any attempt, or None at `until_ms`; raises
        CLOSED once the client closes (its inbox answers nothing more)."""
        got = await self.inbox.next(until_ms, stop)
        if got is None and self.t.is_closing:
            raise SeatgateError(CLOSED, "the seatgate client is closed")
        return got

    async def answer(self, give_up_at: Optional[float], stop: Optional[asyncio.Event] = None) -> Optional[Received]:
        """The first reply that is not REQUEST_EXPIRED (one for an older
        attempt is ignored, one for the latest sends again at once); None
        when `stop` is set; raises TIMEOUT at `give_up_at` (None: never)."""
        if self.sent == 0:
            await self.send()
        while True:
            if stop is not None and stop.is_set():
                return None
            if self.t.is_closing:
                raise SeatgateError(CLOSED, "the seatgate client is closed")
            resend_at = self.last_sent_at + self.t.timing.request_timeout_ms
            until = resend_at if give_up_at is None else min(resend_at, give_up_at)
            got = await self.inbox.next(until, stop)
            if got is None:
                if stop is not None and stop.is_set():
                    return None
                if self.t.is_closing:
                    raise SeatgateError(CLOSED, "the seatgate client is closed")
                if give_up_at is not None and now_ms() >= give_up_at and self.t.out_of_memory:
                    raise SeatgateError(
                        REDIS_UNAVAILABLE,
                        f"no reply to {self.op} {self.license}/{self.session} from {self.t.where}: {OUT_OF_MEMORY}",
                    )
                if give_up_at is not None and now_ms() >= give_up_at:
                    raise SeatgateError(
                        TIMEOUT,
                        f"no reply to {self.op} {self.license}/{self.session} from {self.t.where} after "
                        f"{self.sent} attempts: is a seatgate run worker serving it?",
                    )
                await self.send()
            elif got.reply.get("status") == REQUEST_EXPIRED:
                if self.ids and got.reply.get("id") == self.ids[-1]:
                    await self.send()
            else:
                return got

    def close(self) -> None:
        while self.ids:
            self.t.forget(self.ids.popleft())
        self.inbox.close()


class _AcquireAttempt:
    def __init__(self, lease: str, ex: _Exchange) -> None:
        self._lease = lease
        self._ex = ex

    @property
    def lease(self) -> str:
        return self._lease

    @property
    def attempts(self) -> int:
        return self._ex.sent

    @property
    def first_sent_at(self) -> float:
        return self._ex.first_sent_at

    async def first(self, give_up_at: float, stop: Optional[asyncio.Event] = None) -> Optional[Received]:
        return await self._ex.answer(give_up_at, stop)

    async def next(self, until_ms: float, stop: Optional[asyncio.Event] = None) -> Optional[Received]:
        return await self._ex.next(until_ms, stop)

    def close(self) -> None:
        self._ex.close()


async def read_topology(r: Any, opts: RedisOptions) -> Topology:
    raw: Dict[str, str] = dict(await r.hgetall(f"{opts.key_prefix}:config") or {})
    shards_raw = raw.get("shards", "1")
    shards = int(shards_raw) if shards_raw.isdigit() and int(shards_raw) > 0 else 1
    apps = [a.strip() for a in raw.get("applications", "").split(",") if a.strip()]
    return Topology(
        shards=shards,
        requests=raw.get("requests") or f"{opts.key_prefix}:requests",
        applications=apps,
        replies_prefix=raw.get("replies_prefix") or f"{opts.key_prefix}:reply:",
    )


def env_password(url: str) -> Optional[str]:
    """SEATGATE_REDIS_PASSWORD, unless the URL has a password of its own."""
    if url_has_password(url):
        return None
    return os.environ.get("SEATGATE_REDIS_PASSWORD") or None


def _entries(result: Any) -> List[Tuple[str, Dict[str, str]]]:
    """The (entry id, fields) of an XREAD's answer, RESP2's list of [stream,
    entries] or RESP3's map of stream to entries."""
    streams = list(result.values()) if isinstance(result, dict) else [s[1] for s in (result or [])]
    out: List[Tuple[str, Dict[str, str]]] = []
    for entries in streams:
        if entries and isinstance(entries[0], list) and entries[0] and isinstance(entries[0][0], (list, tuple)):
            entries = entries[0]  # RESP3 may nest them one level deeper
        for entry_id, flat in entries:
            out.append((str(entry_id), fields_of(flat)))
    return out
