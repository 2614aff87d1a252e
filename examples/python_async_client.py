"""A seatgate client for asyncio services: many requests in flight at once on
one connection and one reply stream.

It speaks the wire protocol of docs/protocol.md ("Writing a client") with
redis-py's `redis.asyncio`, to one Redis node (not Redis Cluster), the way
seatgate's own Rust client does:

- One connection for requests. Callers put their XADD on an outbox; a writer
  task sends whatever has piled up as one pipeline (one round trip for many
  requests), and tells each caller its XADD's result.
- One reply stream, seat:reply:<app>:<random>, and one reader task blocked on
  it (`XREAD BLOCK` on a second connection whose socket timeout is longer than
  the block). It hands each reply to the waiter registered under the reply's
  `id`. A waiter is registered *before* its XADD goes out: the reply can
  arrive before the XADD's own answer does.
- At most `max_in_flight` requests sent and not yet answered; past it, callers
  wait for a slot. A queued acquire gives its slot back at QUEUED.
- A timeout per request. A reply that comes after its caller gave up has no
  waiter and is dropped (and counted).
- A failed read is retried, with backoff, from the last reply id read; waiters
  keep waiting until their own timeouts.
- Every acquire carries a lease (docs/protocol.md, "Leases"), a random secret
  the seat is bound to, kept per session and sent with its heartbeats and
  release, so that nobody without it can release or keep alive the seat.
- A seat handle, `await client.acquire_seat(...)`, keeps the seat the way
  docs/protocol.md ("Writing a client") says a client must: every request
  carries `ttl_ms`; one unanswered within the request timeout (or answered
  REQUEST_EXPIRED) is sent again under a new id with the same lease, and a
  reply to any attempt answers it; a QUEUED acquire waits for its GRANTED; a
  task heartbeats at a third of the heartbeat timeout the service last gave
  (the grant's, then each HEARTBEAT_UPDATED's), at once when the grant is old
  news; `seat.lost()` says when and why the service took the seat; an acquire
  given up on (cancelled, or no final answer in time) is undone by a release,
  and a grant that still comes is released again; `seat.release()`, leaving
  `async with seat:`, or leaving the client releases the seat.

The __main__ below runs 200 concurrent acquire/release pairs from one client,
each through a seat handle (which heartbeats while a seat is held longer than
a third of its timeout), and prints a summary. Run it against a Redis with a `seatgate run` worker and
a provisioned license:

    pip install redis    # or Debian's python3-redis (redis-py 4.3 works)
    seatgate --redis redis://127.0.0.1:6379 license put demo --seats 50
    seatgate --redis redis://127.0.0.1:6379 run &
    python3 examples/python_async_client.py --redis-url redis://127.0.0.1:6379 --license demo --wait 30

With 50 seats and 200 sessions, most acquires get QUEUED and then GRANTED as
others release. Each acquire names the user its seat counts for (`user`):
--user, else your OS login name; `seatgate status` shows it. With `stream.shards` = N > 1, pass --shards N. The password,
if any, comes from SEATGATE_REDIS_PASSWORD, so that it is on no command line.
Exit code: 0 when every pair got its seat and gave it back, 1 when some acquire
was refused, 3 on errors (Redis unreachable, no reply in time).
"""

import argparse
import asyncio
import collections
import logging
import sys
import time
import uuid

import redis
import redis.asyncio as aioredis

from seatgate_wire import (DEFAULT_HEARTBEAT_TIMEOUT_S, GRANTS, QUEUE_MARGIN_S, REPLY_PREFIX, REQUEST_EXPIRED,
                           REQUESTS_STREAM, RETRY_LATER, Leases, ReplyTimeout, acquire_fields, add_common_args,
                           clock_age_s, heartbeat_timeout_s, redis_password, reply_stream, request_fields,
                           requests_stream_of, stream_for, ttl_field)

# How long one XREAD blocks. The reader is stopped by cancelling it, so this
# only bounds how long a silent connection goes unnoticed.
READ_BLOCK_MS = 5000
# Most XADDs per pipeline.
WRITE_BATCH = 512
# Attempts of one request whose replies a seat handle still awaits; older
# ones are forgotten (with ttl_ms they have long expired).
ATTEMPTS_KEPT = 4

log = logging.getLogger("seatgate.async_client")


def _one_connection(url, **options):
    """A redis.asyncio client that keeps to one connection of its own.
    Built from a pool rather than with from_url(single_connection_client=True),
    which redis-py 4.x (Debian 12's python3-redis is 4.3) hands on to the
    connection and fails with."""
    pool = aioredis.ConnectionPool.from_url(url, decode_responses=True, **options)
    return aioredis.Redis(connection_pool=pool, single_connection_client=True)


async def _close(r):
    """Closes a client of _one_connection, and its pool (a client given a pool
    leaves it open). redis-py 5 names it aclose(); 4.x only has close()."""
    await (getattr(r, "aclose", None) or r.close)()
    await r.connection_pool.disconnect()


class Reply(dict):
    """A reply's fields (every value a string), and the id of its entry on
    the reply stream: Redis's clock when it was written."""
    entry_id = ""


class _Waiter:
    """Where one request id's replies go: a queue of its own, or one it
    shares with the other attempts of the same request."""

    def __init__(self, holds_slot, replies=None):
        self.replies = replies if replies is not None else asyncio.Queue()
        # Whether it still holds an in-flight slot (until its first reply).
        self.holds_slot = holds_slot


class Pending:
    """A request sent: its replies arrive here, QUEUED first for a queued
    acquire, then GRANTED or QUEUE_TIMEOUT under the same id. Use it with
    `async with`, or call close(), so that its waiter is removed."""

    def __init__(self, client, request_id):
        self._client = client
        self.id = request_id

    async def reply(self, timeout):
        """The next reply (a dict of strings), waiting up to `timeout` seconds."""
        waiter = self._client._waiters.get(self.id)
        if waiter is None:
            raise RuntimeError(f"request {self.id} is no longer waited for")
        try:
            return await asyncio.wait_for(waiter.replies.get(), timeout)
        except asyncio.TimeoutError:
            raise ReplyTimeout(f"no reply to request {self.id} within {timeout:.1f} s") from None

    async def final_reply(self, timeout):
        """The first reply that is not QUEUED (a redelivered request may
        repeat its QUEUED), waiting up to `timeout` seconds in all."""
        deadline = time.monotonic() + timeout
        while True:
            reply = await self.reply(max(0.0, deadline - time.monotonic()))
            if reply.get("status") != "QUEUED":
                return reply

    def close(self):
        self._client._unregister(self.id)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()


class SeatClient:
    """One connection for requests, one reply stream, any number of callers.

    Use it as `async with SeatClient(url) as client:`; leaving the block stops
    the reader and writer and deletes the reply stream."""

    def __init__(self, url, *, app="seatgate-py", requests_stream=REQUESTS_STREAM, shards=1,
                 reply_prefix=REPLY_PREFIX, max_in_flight=256, password=None):
        auth = {"password": password} if password else {}
        # One connection each, not a pool that would open one per concurrent
        # command.
        self._write = _one_connection(url, **auth)
        # The reader's socket timeout must outlast its block: a shorter one
        # would abort a read the server still answers.
        self._read = _one_connection(url, socket_timeout=READ_BLOCK_MS / 1000 + 5, **auth)
        self.requests_stream = requests_stream
        self.shards = shards
        self.reply_to = reply_stream(reply_prefix, app)
        self.max_in_flight = max_in_flight
        self._slots = asyncio.Semaphore(max_in_flight)
        self._waiters = {}
        self._outbox = asyncio.Queue()
        self._tasks = []
        # Set on exit, before the reader is cancelled: a blocking XREAD that
        # is cancelled can return an empty result instead of raising
        # (redis-py 4.3 to 8.2 were seen to), and the reader must still end.
        self._closing = False
        # The lease each (license, session) is bound to, sent with its later requests.
        self.leases = Leases()
        # Seat handles not yet released, released when the client closes;
        # the tasks undoing acquires given up on, awaited then while they
        # still release, stopped once they only listen for late grants.
        self._seats = set()
        self._undoing = set()
        self._listening = set()
        # Counters for the curious: replies without a waiter, read retries,
        # pipelines written, and the most requests in flight at once.
        self.stats = collections.Counter()

    async def __aenter__(self):
        self._tasks = [asyncio.create_task(self._read_loop()), asyncio.create_task(self._write_loop())]
        return self

    async def __aexit__(self, *exc):
        # Give back what is still held, and let undoing acquires finish,
        # while the reader and writer still run.
        for seat in list(self._seats):
            try:
                await seat.release()
            except (ReplyTimeout, redis.RedisError, OSError) as e:
                log.warning("could not release %s/%s on exit: %s", seat.license, seat.session, e)
        if self._undoing:
            await asyncio.gather(*self._undoing, return_exceptions=True)
        for task in list(self._listening):
            task.cancel()
        await asyncio.gather(*self._listening, return_exceptions=True)
        # The reader is ended by closing its connection under its blocking
        # XREAD, not by cancelling it: a cancelled XREAD can return an empty
        # result instead of raising, or leave the cancellation pending in
        # redis-py (4.3 to 8.2 were seen to), and an exit waited forever.
        self._closing = True
        reader, writer = self._tasks
        writer.cancel()
        await self._read.connection_pool.disconnect(inuse_connections=True)
        done, _ = await asyncio.wait([reader], timeout=2.0)
        if not done:
            reader.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self._write.delete(self.reply_to)
        except redis.RedisError:
            pass  # best effort: an idle reply stream expires by itself
        await _close(self._write)
        await _close(self._read)

    def stream_for(self, license):
        """The requests stream (shard) that serves `license`."""
        return stream_for(self.requests_stream, self.shards, license)

    async def request(self, op, license, session, _replies=None, **fields):
        """Sends one request once an in-flight slot is free; returns its Pending."""
        await self._slots.acquire()
        request_id = uuid.uuid4().hex
        # Registered before the XADD: the reply may come before XADD returns.
        self._waiters[request_id] = _Waiter(holds_slot=True, replies=_replies)
        self.stats["most_in_flight"] = max(self.stats["most_in_flight"], self.in_flight())
        request = request_fields(op, request_id, license, session, self.reply_to, fields)
        sent = asyncio.get_running_loop().create_future()
        await self._outbox.put((self.stream_for(license), request, sent))
        try:
            await sent
        except BaseException:
            self._unregister(request_id)
            raise
        return Pending(self, request_id)

    async def call(self, op, license, session, timeout=5.0, **fields):
        """Sends one request and returns its first reply (QUEUED, for a
        queued acquire); the whole call, slot wait included, within `timeout`."""
        async def first():
            async with await self.request(op, license, session, **fields) as pending:
                return await pending.reply(timeout)
        try:
            return await asyncio.wait_for(first(), timeout)
        except asyncio.TimeoutError:
            raise ReplyTimeout(f"no reply to {op} {license}/{session} within {timeout:.1f} s") from None

    def lease(self, license, session):
        """The lease this client holds for the session, or None."""
        return self.leases.get(license, session)

    async def acquire(self, license, session, meta=None, wait_s=0.0, timeout=5.0, on_queued=None, lease=None,
                      user=None, group=None, priority=0, borrow_s=0.0):
        """One acquire, no more (acquire_seat re-sends, heartbeats and
        releases for you); it carries ttl_ms = `timeout`. Takes a seat for
        `user` (None: nobody in particular), waiting up to `wait_s` seconds in
        the license's queue when none is free, bound to `lease` (default: the
        one held for the session, else a new random one); `group`,
        `priority` and `borrow_s` are the license policies' fields
        (seatgate_wire.acquire_fields). Returns the final reply;
        `on_queued(reply)` is called with the QUEUED reply, if any."""
        fields = {**acquire_fields(self.leases.bind(license, session, lease), meta, wait_s, user, group, priority,
                                   borrow_s),
                  **ttl_field(timeout)}
        async with await self.request("acquire", license, session, **fields) as pending:
            reply = await pending.reply(timeout)
            if reply.get("status") != "QUEUED":
                return reply
            if on_queued:
                on_queued(reply)
            return await pending.final_reply(wait_s + timeout + QUEUE_MARGIN_S)

    async def heartbeat(self, license, session, timeout=5.0):
        """Keeps the session's seat alive, with the lease it was acquired with."""
        return await self.call("heartbeat", license, session, timeout, **self.leases.field(license, session),
                               **ttl_field(timeout))

    async def release(self, license, session, timeout=5.0):
        """Gives the session's seat back (or leaves the queue), with its lease."""
        reply = await self.call("release", license, session, timeout, **self.leases.field(license, session),
                                **ttl_field(timeout))
        self.leases.settle(license, session, reply)
        return reply

    async def acquire_seat(self, license, session, meta=None, wait_s=0.0, lease=None, request_timeout=5.0,
                           ttl_s=None, give_up_s=30.0, on_queued=None, user=None, group=None, priority=0,
                           borrow_s=0.0):
        """Takes a seat for `user` (None: nobody in particular) and returns a
        Seat that keeps it (see the module's doc); raises SeatRefused with the
        reply when the service says no (NO_SEATS_AVAILABLE, QUEUE_TIMEOUT,
        ...), ReplyTimeout when no attempt is answered within `give_up_s` (or,
        once QUEUED, within the wait and a margin). Every request carries
        `ttl_s` (default: `request_timeout`). `group`, `priority` and
        `borrow_s` go to the license's policies (seatgate_wire.acquire_fields)."""
        lease = self.leases.bind(license, session, lease)
        ttl = ttl_field(request_timeout if ttl_s is None else ttl_s)
        fields = {**acquire_fields(lease, meta, wait_s, user, group, priority, borrow_s), **ttl}
        acquire = _Exchange(self, "acquire", license, session, fields, request_timeout)
        undo = True
        try:
            reply = await acquire.answer(time.monotonic() + give_up_s)
            if reply.get("status") == "QUEUED":
                # Decided: wait for GRANTED or QUEUE_TIMEOUT under the id of
                # whichever attempt queued it last, and send nothing more.
                if on_queued:
                    on_queued(reply)
                deadline = time.monotonic() + wait_s + request_timeout + QUEUE_MARGIN_S
                while reply.get("status") in ("QUEUED", REQUEST_EXPIRED):
                    reply = await acquire.next(deadline)
                    if reply is None:
                        raise ReplyTimeout(f"no final answer to the queued acquire of {license}/{session}")
            if reply.get("status") not in GRANTS:
                # One attempt answered is the whole story; with more, an older
                # one might still be decided by a service that does not expire
                # requests: undo that grant too.
                undo = acquire.sent > 1
                raise SeatRefused(reply)
            undo = False
        finally:
            if undo:
                task = asyncio.ensure_future(self._undo(acquire, license, session, {"lease": lease, **ttl},
                                                        request_timeout, give_up_s))
                self._undoing.add(task)
                task.add_done_callback(self._undoing.discard)
            else:
                acquire.close()
        timeout = heartbeat_timeout_s(reply, DEFAULT_HEARTBEAT_TIMEOUT_S)
        # How long ago the seat's heartbeat clock started: the service says
        # so (held_since_ms); else a clock started for this acquire started
        # after its first attempt went out, and ALREADY_ACTIVE's may be older
        # still, so it is taken as run out.
        age = clock_age_s(reply, reply.entry_id)
        if age is None:
            age = timeout if reply.get("status") == "ALREADY_ACTIVE" else time.monotonic() - acquire.first_sent
        return Seat(self, license, session, {"lease": lease, **ttl}, reply, timeout,
                    max(0.0, timeout / 3 - age), request_timeout, give_up_s)

    async def _undo(self, acquire, license, session, fields, request_timeout, give_up_s):
        """Releases a session whose acquire was given up on (a queued one
        leaves the queue), then releases again after any grant that still
        comes to one of the acquire's attempts."""
        task = asyncio.current_task()
        try:
            await self.exchange("release", license, session, fields, request_timeout, give_up_s)
            self._undoing.discard(task)
            self._listening.add(task)
            until = time.monotonic() + give_up_s
            while True:
                reply = await acquire.next(until)
                if reply is None:
                    return
                if reply.get("status") in GRANTS:
                    log.info("releasing %s/%s, granted after its acquire was given up on", license, session)
                    await self.exchange("release", license, session, fields, request_timeout, give_up_s)
        except (ReplyTimeout, redis.RedisError, OSError) as e:
            log.warning("could not undo the acquire of %s/%s: %s", license, session, e)
        finally:
            self._listening.discard(task)
            acquire.close()

    async def exchange(self, op, license, session, fields, request_timeout=5.0, give_up_s=30.0,
                       keep=ATTEMPTS_KEPT):
        """Sends a request until one of its attempts is answered (see
        _Exchange) or `give_up_s` passes (None: never); returns the reply."""
        ex = _Exchange(self, op, license, session, fields, request_timeout, keep)
        try:
            return await ex.answer(None if give_up_s is None else time.monotonic() + give_up_s)
        finally:
            ex.close()

    def in_flight(self):
        """Requests sent (or about to be) and not answered yet."""
        return sum(1 for w in self._waiters.values() if w.holds_slot)

    def _unregister(self, request_id):
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and waiter.holds_slot:
            self._slots.release()

    async def _write_loop(self):
        """Sends queued XADDs, as many as have piled up, in one pipeline."""
        while True:
            batch = [await self._outbox.get()]
            while len(batch) < WRITE_BATCH and not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            pipe = self._write.pipeline(transaction=False)
            for stream, request, _ in batch:
                pipe.xadd(stream, request)
            try:
                results = await pipe.execute(raise_on_error=False)
            except Exception as e:
                # The connection failed: every XADD of the batch fails (some
                # may have been applied; their replies find no waiter). Any
                # other error fails them too: were it to end this task, every
                # caller would wait for its XADD forever.
                results = [e] * len(batch)
            self.stats["pipelines"] += 1
            for (_, _, sent), result in zip(batch, results):
                if sent.done():
                    continue  # its caller was cancelled
                if isinstance(result, Exception):
                    sent.set_exception(result)
                else:
                    sent.set_result(result)

    async def _read_loop(self):
        """Reads the reply stream and hands each reply to its waiter."""
        last = "0-0"  # the stream is new and ours alone
        backoff = 0.05
        while not self._closing:
            try:
                read = await self._read.xread({self.reply_to: last}, count=500, block=READ_BLOCK_MS)
                backoff = 0.05
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                if self._closing:
                    return
                self.stats["read_retries"] += 1
                log.warning("cannot read replies (%s); retrying from %s in %.2f s", e, last, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            for _stream, entries in read or []:
                for entry_id, fields in entries:
                    last = entry_id
                    waiter = self._waiters.get(fields.get("id"))
                    if waiter is None:
                        # Late (its caller timed out), or a GRANTED whose
                        # caller stopped waiting at QUEUED.
                        self.stats["unclaimed"] += 1
                        continue
                    if waiter.holds_slot:
                        waiter.holds_slot = False
                        self._slots.release()
                    reply = Reply(fields)
                    reply.entry_id = entry_id
                    waiter.replies.put_nowait(reply)


class SeatRefused(Exception):
    """The service answered an acquire, and not with a seat; `reply` says why."""

    def __init__(self, reply):
        super().__init__(f"{reply.get('status')} {reply.get('error', '')}".strip())
        self.reply = reply


class _Exchange:
    """One request carried through timeouts: every attempt under a new id
    with the same fields (lease and ttl_ms included), all answering into one
    queue, so that a reply to any attempt answers the request."""

    def __init__(self, client, op, license, session, fields, request_timeout, keep=ATTEMPTS_KEPT):
        self.client, self.op, self.license, self.session = client, op, license, session
        self.fields = fields
        self.request_timeout = request_timeout
        # How many attempts' replies are awaited (None: all): a release keeps
        # every one, since a frozen Redis decides them all at once, the
        # first RELEASED and the rest SESSION_NOT_FOUND.
        self.keep = keep
        self.replies = asyncio.Queue()
        self.ids = collections.deque()
        self.sent = 0
        self.first_sent = self.last_sent = time.monotonic()

    async def send(self):
        """One more attempt. A failed XADD (Redis unreachable) is only
        logged: the next attempt follows after the request timeout."""
        self.last_sent = time.monotonic()
        if not self.sent:
            self.first_sent = self.last_sent
        self.sent += 1
        try:
            pending = await self.client.request(self.op, self.license, self.session, _replies=self.replies,
                                                **self.fields)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            log.warning("cannot send %s for %s/%s (%s); trying again", self.op, self.license, self.session, e)
            return
        self.ids.append(pending.id)
        if self.keep is not None and len(self.ids) > self.keep:
            self.client._unregister(self.ids.popleft())

    async def next(self, until):
        """The next reply to any attempt, or None once `until` (monotonic) passes."""
        try:
            return await asyncio.wait_for(self.replies.get(), max(0.0, until - time.monotonic()))
        except asyncio.TimeoutError:
            return None

    async def answer(self, give_up=None):
        """The first reply that is not REQUEST_EXPIRED. Sends the first
        attempt, another after each request timeout without a reply and at
        once when the latest expired; gives up at `give_up` (None: never)."""
        if not self.sent:
            await self.send()
        while True:
            until = self.last_sent + self.request_timeout
            if give_up is not None:
                until = min(until, give_up)
            reply = await self.next(until)
            if reply is None:
                if give_up is not None and time.monotonic() >= give_up:
                    raise ReplyTimeout(f"no reply to {self.op} {self.license}/{self.session} "
                                       f"after {self.sent} attempts")
                await self.send()
            elif reply.get("status") == REQUEST_EXPIRED:
                if self.ids and reply.get("id") == self.ids[-1]:
                    await self.send()
            else:
                return reply

    def close(self):
        """Stops waiting for any attempt's reply."""
        while self.ids:
            self.client._unregister(self.ids.popleft())


class Seat:
    """A seat the session holds, kept by a heartbeat task of its own.

    `state` is "held", "lost" or "released"; `lost_status` the status that
    took it (SESSION_NOT_ACTIVE, SESSION_REVOKED, LEASE_MISMATCH, ...);
    `heartbeat_timeout` the one the service last gave, in seconds;
    `heartbeats` how many were answered. `await seat.lost()` returns when the
    seat is no longer held. `async with seat:` releases it on the way out."""

    def __init__(self, client, license, session, fields, grant, timeout, first_pause, request_timeout, give_up_s):
        self.client, self.license, self.session = client, license, session
        self.grant = grant
        self.lease = fields["lease"]
        self._fields = fields
        self._request_timeout, self._give_up_s = request_timeout, give_up_s
        self.state = "held"
        self.lost_status = None
        self.heartbeat_timeout = timeout
        self.heartbeats = 0
        # When the seat's heartbeat clock last restarted, as this handle saw
        # it: a release keeps trying until the timeout ran out since then.
        self._last_beat = time.monotonic()
        self._gone = asyncio.Event()
        self._task = asyncio.ensure_future(self._heartbeat(first_pause))
        client._seats.add(self)

    async def lost(self):
        """Waits until the seat is no longer held; its state then."""
        await self._gone.wait()
        return self.state

    async def release(self):
        """Stops heartbeating and gives the seat back. Never reports a
        release that worked as failed: it keeps sending (new ids, the same
        lease; a reply to any attempt counts) until the service answers, or
        until the seat's heartbeat timeout has run out since its last
        answered heartbeat (and at least `give_up_s`), through a Redis outage
        or freeze. Returns the reply: RELEASED (or LEFT_QUEUE); the one that
        says it was already gone (SESSION_NOT_FOUND, SESSION_REVOKED, ...);
        or, when no attempt was answered by then, a reply of status UNKNOWN
        (not a wire status): a seat whose release never arrived has been
        evicted by then."""
        self.client._seats.discard(self)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        give_up = max(self._give_up_s,
                      self._last_beat + self.heartbeat_timeout + self._request_timeout - time.monotonic())
        deadline = time.monotonic() + give_up
        while True:
            try:
                reply = await self.client.exchange("release", self.license, self.session, self._fields,
                                                   self._request_timeout, max(0.0, deadline - time.monotonic()),
                                                   keep=None)
            except ReplyTimeout:
                reply = Reply({"status": "UNKNOWN", "license": self.license, "session": self.session,
                               "error": "no answer before the seat's heartbeat timeout ran out: if the release "
                                        "never reached the service, the seat has been evicted"})
                break
            if reply.get("status") in RETRY_LATER and time.monotonic() < deadline:
                await asyncio.sleep(max(0.01, self._request_timeout / 5))
                continue
            self.client.leases.settle(self.license, self.session, reply)
            break
        if self.state == "held" and reply.get("status") != "UNKNOWN":
            self.state = "released"
        self._gone.set()
        return reply

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        if self in self.client._seats:
            await self.release()

    async def _heartbeat(self, pause):
        """Heartbeats, the first after `pause`, then at a third of the
        timeout last heard, until cancelled or the seat is lost."""
        while True:
            await asyncio.sleep(pause)
            reply = await self.client.exchange("heartbeat", self.license, self.session, self._fields,
                                               self._request_timeout, None)
            status = reply.get("status")
            if status == "HEARTBEAT_UPDATED":
                # A service that does not send the timeout on heartbeats
                # leaves the grant's in force.
                self.heartbeat_timeout = heartbeat_timeout_s(reply, self.heartbeat_timeout)
                self.heartbeats += 1
                self._last_beat = time.monotonic()
                pause = self.heartbeat_timeout / 3
            elif status in RETRY_LATER:
                pause = self.heartbeat_timeout / 6
            else:
                log.warning("lost the seat of %s/%s: %s %s", self.license, self.session, status,
                            reply.get("error", ""))
                self.state, self.lost_status = "lost", status
                self.client._seats.discard(self)
                self._gone.set()
                return


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0


async def pairs(args):
    password = redis_password()
    statuses = collections.Counter()
    latencies = []
    heartbeats = []

    async with SeatClient(args.redis_url, app=args.app, requests_stream=requests_stream_of(args), shards=args.shards,
                          max_in_flight=args.max_in_flight, password=password) as client:
        async def pair(i):
            session = f"py-async-{i}"
            started = time.monotonic()
            try:
                seat = await client.acquire_seat(args.license, session, meta={"client": "python_async_client.py"},
                                                 wait_s=args.wait, request_timeout=args.timeout, user=args.user,
                                                 on_queued=lambda r: statuses.update(["QUEUED"]))
            except SeatRefused as refused:
                latencies.append(time.monotonic() - started)
                statuses[refused.reply["status"]] += 1
                return
            latencies.append(time.monotonic() - started)
            statuses[seat.grant["status"]] += 1
            await asyncio.sleep(args.hold)
            if seat.state == "lost":
                statuses[f"LOST:{seat.lost_status}"] += 1
            heartbeats.append(seat.heartbeats)
            started = time.monotonic()
            gone = await seat.release()
            latencies.append(time.monotonic() - started)
            statuses[gone["status"]] += 1

        started = time.monotonic()
        results = await asyncio.gather(*(pair(i) for i in range(args.pairs)), return_exceptions=True)
        elapsed = time.monotonic() - started
        errors = [r for r in results if isinstance(r, BaseException)]
        stats = dict(client.stats)

    print(f"{args.pairs} acquire/release pairs on license {args.license!r} from one client "
          f"(1 request connection, 1 reply stream, max {args.max_in_flight} in flight)")
    print(f"  finished in {elapsed:.2f} s: {sum(statuses[s] for s in statuses if s != 'QUEUED') / elapsed:.0f} final replies/s")
    print(f"  replies:     {', '.join(f'{s} {n}' for s, n in sorted(statuses.items()))}")
    print(f"  latency:     p50 {percentile(latencies, 50) * 1000:.1f} ms, p99 {percentile(latencies, 99) * 1000:.1f} ms "
          "(acquire: until the final reply, queue wait included)")
    print(f"  pipelines:   {stats.get('pipelines', 0)} written, most in flight at once {stats.get('most_in_flight', 0)}, "
          f"replies without a waiter {stats.get('unclaimed', 0)}, read retries {stats.get('read_retries', 0)}")
    print(f"  seats:       {sum(heartbeats)} heartbeats while held, at most {max(heartbeats, default=0)} for one seat")
    for e in errors[:5]:
        print(f"  error: {e!r}", file=sys.stderr)
    if errors:
        return 3
    refused = args.pairs - statuses["ACQUIRED"] - statuses["GRANTED"] - statuses["ALREADY_ACTIVE"]
    return 1 if refused else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Many concurrent acquire/release pairs from one asyncio seatgate client.")
    add_common_args(parser)
    parser.add_argument("--pairs", type=int, default=200, help="concurrent acquire/release pairs (default: %(default)s)")
    parser.add_argument("--wait", type=float, default=30.0,
                        help="seconds an acquire may wait in the queue when no seat is free (default: %(default)s)")
    parser.add_argument("--hold", type=float, default=0.05, help="seconds each seat is held (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each reply (default: %(default)s)")
    parser.add_argument("--max-in-flight", type=int, default=64, help="most requests in flight (default: %(default)s)")
    parser.add_argument("--shards", type=int, default=1, help="the service's stream.shards (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return asyncio.run(pairs(args))
    except (ReplyTimeout, redis.RedisError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
