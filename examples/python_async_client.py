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

The __main__ below runs 200 concurrent acquire/release pairs from one client
and prints a summary. Run it against a Redis with a `seatgate run` worker and
a provisioned license:

    pip install redis    # or Debian's python3-redis (redis-py 4.3 works)
    seatgate --redis redis://127.0.0.1:6379 license put demo --seats 50
    seatgate --redis redis://127.0.0.1:6379 run &
    python3 examples/python_async_client.py --redis-url redis://127.0.0.1:6379 --license demo --wait 30

With 50 seats and 200 sessions, most acquires get QUEUED and then GRANTED as
others release. With `stream.shards` = N > 1, pass --shards N. The password,
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

from seatgate_wire import (QUEUE_MARGIN_S, REPLY_PREFIX, REQUESTS_STREAM, Leases, ReplyTimeout, acquire_fields,
                           add_common_args, redis_password, reply_stream, request_fields, stream_for)

# How long one XREAD blocks. The reader is stopped by cancelling it, so this
# only bounds how long a silent connection goes unnoticed.
READ_BLOCK_MS = 5000
# Most XADDs per pipeline.
WRITE_BATCH = 512

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


class _Waiter:
    """Where one request id's replies go."""

    def __init__(self, holds_slot):
        self.replies = asyncio.Queue()
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
        # The lease each (license, session) is bound to, sent with its later requests.
        self.leases = Leases()
        # Counters for the curious: replies without a waiter, read retries,
        # pipelines written, and the most requests in flight at once.
        self.stats = collections.Counter()

    async def __aenter__(self):
        self._tasks = [asyncio.create_task(self._read_loop()), asyncio.create_task(self._write_loop())]
        return self

    async def __aexit__(self, *exc):
        for task in self._tasks:
            task.cancel()
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

    async def request(self, op, license, session, **fields):
        """Sends one request once an in-flight slot is free; returns its Pending."""
        await self._slots.acquire()
        request_id = uuid.uuid4().hex
        # Registered before the XADD: the reply may come before XADD returns.
        self._waiters[request_id] = _Waiter(holds_slot=True)
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

    async def acquire(self, license, session, meta=None, wait_s=0.0, timeout=5.0, on_queued=None, lease=None):
        """Takes a seat, waiting up to `wait_s` seconds in the license's queue
        when none is free, bound to `lease` (default: the one held for the
        session, else a new random one). Returns the final reply;
        `on_queued(reply)` is called with the QUEUED reply, if any."""
        fields = acquire_fields(self.leases.bind(license, session, lease), meta, wait_s)
        async with await self.request("acquire", license, session, **fields) as pending:
            reply = await pending.reply(timeout)
            if reply.get("status") != "QUEUED":
                return reply
            if on_queued:
                on_queued(reply)
            return await pending.final_reply(wait_s + timeout + QUEUE_MARGIN_S)

    async def heartbeat(self, license, session, timeout=5.0):
        """Keeps the session's seat alive, with the lease it was acquired with."""
        return await self.call("heartbeat", license, session, timeout, **self.leases.field(license, session))

    async def release(self, license, session, timeout=5.0):
        """Gives the session's seat back (or leaves the queue), with its lease."""
        reply = await self.call("release", license, session, timeout, **self.leases.field(license, session))
        self.leases.settle(license, session, reply)
        return reply

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
        while True:
            try:
                read = await self._read.xread({self.reply_to: last}, count=500, block=READ_BLOCK_MS)
                backoff = 0.05
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
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
                    waiter.replies.put_nowait(fields)


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0


async def pairs(args):
    password = redis_password()
    statuses = collections.Counter()
    latencies = []

    async with SeatClient(args.redis_url, app=args.app, shards=args.shards,
                          max_in_flight=args.max_in_flight, password=password) as client:
        async def pair(i):
            session = f"py-async-{i}"
            started = time.monotonic()
            got = await client.acquire(args.license, session, meta={"client": "python_async_client.py"},
                                       wait_s=args.wait, timeout=args.timeout,
                                       on_queued=lambda r: statuses.update(["QUEUED"]))
            latencies.append(time.monotonic() - started)
            statuses[got["status"]] += 1
            if got.get("ok") != "1":
                return
            await asyncio.sleep(args.hold)
            started = time.monotonic()
            gone = await client.release(args.license, session, timeout=args.timeout)
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
