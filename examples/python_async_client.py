"""Many seats at once from one asyncio seatgate client: many requests in
flight on one connection and one reply stream.

It uses the `seatgate` package (clients/python), whose asyncio `Client`
speaks the wire protocol of docs/protocol.md ("Writing a client") with
redis-py's `redis.asyncio`, to one Redis node (not Redis Cluster):

- One connection for requests: whatever XADDs have piled up go as one
  pipeline (one round trip for many requests).
- One reply stream, seat:reply:<app>:<random>, and one reader task blocked on
  it (`XREAD BLOCK` on a second connection whose socket timeout is longer than
  the block), handing each reply to the request waiting under its `id`,
  registered before its XADD went out.
- At most `max_in_flight` requests sent and not yet answered.
- A seat handle per seat, `await client.acquire_seat(...)`: every request
  carries the seat's lease and `ttl_ms`; one unanswered within the request
  timeout (or answered REQUEST_EXPIRED) is sent again under a new id with
  the same lease; a QUEUED acquire waits for its GRANTED, heartbeating to
  keep its place, and claims the grant at once; a task heartbeats at a third
  of the heartbeat timeout the service last gave; `seat.lost()` says when
  and why the service took the seat; `seat.release()` is honest; leaving the
  client releases what is still held and always ends within about 2 s.

The __main__ below runs 200 concurrent acquire/release pairs from one client,
each through a seat handle, and prints a summary. Run it against a Redis
with a `seatgate run` worker and a provisioned license:

    pip install ./clients/python    # or run from the repository: it finds the package
    seatgate --redis redis://127.0.0.1:6379 license put demo --seats 50
    seatgate --redis redis://127.0.0.1:6379 run &
    python3 examples/python_async_client.py --redis-url redis://127.0.0.1:6379 --license demo --wait 30

With 50 seats and 200 sessions, most acquires get QUEUED and then GRANTED as
others release. Each acquire names the user its seat counts for (`user`):
--user, else your OS login name; `seatgate status` shows it. The shard count
comes from seat:config (or --shards N). The password, if any, comes from
SEATGATE_REDIS_PASSWORD, so that it is on no command line.
Exit code: 0 when every pair got its seat and gave it back, 1 when some acquire
was refused, 3 on errors (Redis unreachable, no reply in time).
"""

import argparse
import asyncio
import collections
import logging
import os
import sys
import time

try:
    import seatgate
except ImportError:  # run from the repository: the package is beside it
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python", "src"))
    import seatgate

from python_client import add_common_args


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0


async def pairs(args):
    statuses = collections.Counter()
    latencies = []
    heartbeats = []

    async with await seatgate.Client.connect(args.redis_url, application=args.app, shards=args.shards,
                                             request_timeout_ms=args.timeout * 1000,
                                             max_in_flight=args.max_in_flight) as client:
        async def pair(i):
            session = f"py-async-{i}"
            queued = []
            started = time.monotonic()
            try:
                seat = await client.acquire_seat(args.license, session, user=args.user,
                                                 meta={"client": "python_async_client.py"},
                                                 wait_ms=int(args.wait * 1000),
                                                 on_queued=lambda position, reply: queued.append(position))
            except seatgate.SeatgateError as refused:
                if refused.reply is None:
                    raise
                latencies.append(time.monotonic() - started)
                statuses[refused.code] += 1
                return
            finally:
                # Told at QUEUED, and again at each waiter heartbeat: one wait.
                if queued:
                    statuses["QUEUED"] += 1
            latencies.append(time.monotonic() - started)
            statuses[seat.grant["status"]] += 1
            await asyncio.sleep(args.hold)
            if seat.state == "lost":
                statuses[f"LOST:{seat.lost_status}"] += 1
            heartbeats.append(seat.heartbeats)
            started = time.monotonic()
            gone = await seat.release()
            latencies.append(time.monotonic() - started)
            statuses[gone.reply["status"] if gone.reply is not None else "UNKNOWN"] += 1

        started = time.monotonic()
        results = await asyncio.gather(*(pair(i) for i in range(args.pairs)), return_exceptions=True)
        elapsed = time.monotonic() - started
        errors = [r for r in results if isinstance(r, BaseException)]
        stats = client.stats

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
        print(f"  error: {e}", file=sys.stderr)
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
    parser.add_argument("--shards", type=int, default=None,
                        help="the service's stream.shards (default: what the workers recorded in seat:config, else 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return asyncio.run(pairs(args))
    except seatgate.SeatgateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
