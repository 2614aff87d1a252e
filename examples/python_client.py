"""A minimal seatgate client in Python: acquire (waiting in the queue if asked),
heartbeat and release a seat.

It speaks the wire protocol of docs/protocol.md directly with redis-py, to
one Redis node (not Redis Cluster). Each call XADDs a request (with a unique
`id` and this client's own `reply_to` stream, seat:reply:<app>:<random>) to
`seat:requests` and, in the
same round trip (a pipeline), starts an XREAD BLOCK on the reply stream; it
keeps reading until the reply carrying that id arrives, or the timeout passes.
An acquire that gets QUEUED keeps reading for the final GRANTED or
QUEUE_TIMEOUT, which carries the same id. With `stream.shards` = N > 1 the
requests go to `seat:requests:{i}`, i = crc32(license) % N (docs/protocol.md,
"Shards and Redis Cluster"). The workers record N in the HASH `seat:config`
(field `shards`); the client reads it there unless --shards says otherwise.

Every acquire carries a lease (docs/protocol.md, "Leases"): a random secret
the seat is bound to. The client makes one per session (or takes the
caller's, `lease=`), keeps it, and sends it with that session's heartbeats,
releases and re-sent acquires; nobody without it can release or keep alive
the seat. It prints the lease, never logs it elsewhere; pass it back with
--lease to pick up a seat after a restart.

Run it against a Redis with a `seatgate run` worker and a provisioned license:

    pip install redis    # or Debian's python3-redis (redis-py 4.3 works)
    seatgate --redis redis://127.0.0.1:6379 license put demo --seats 1
    seatgate --redis redis://127.0.0.1:6379 run &
    python3 examples/python_client.py --redis-url redis://127.0.0.1:6379 --license demo &
    python3 examples/python_client.py --redis-url redis://127.0.0.1:6379 --license demo --wait 30

With ops/redis-users.acl installed, log in as the application's client user
(the password from the environment, so that it is on no command line),
give the application name its ACL key pattern allows (seat:reply:demo:*) and
send to the application's own requests stream, seat:requests:app:demo (the
workers list it in stream.applications), the only one its user may write:

    SEATGATE_REDIS_PASSWORD=... python3 examples/python_client.py \
        --redis-url redis://seatgate-client-demo@127.0.0.1:6379 --app demo --own-stream --license demo

Each acquire names the user its seat counts for, in the `user` field: --user,
else your OS login name. `seatgate status` shows it in its USER column (the
`meta` sent along is display data, never the user). The second copy finds the
only seat taken, prints QUEUED, and gets GRANTED when the first releases. It prints each reply, and exits 1 when the acquire
was refused (NO_SEATS_AVAILABLE, QUEUE_TIMEOUT, ...), 2 for a malformed
--lease, 3 when Redis or the worker did not answer, 0 otherwise.
"""

import argparse
import json
import sys
import time
import uuid

import redis

from seatgate_wire import (CONFIG_KEY, QUEUE_MARGIN_S, REPLY_PREFIX, REQUESTS_STREAM, Leases, ReplyTimeout,
                           acquire_fields, add_common_args, redis_password, reply_stream, request_fields,
                           requests_stream_of, stream_for, ttl_field)


class SeatClient:
    """Sends seat requests and waits for their replies on a private stream."""

    def __init__(self, r: redis.Redis, app: str = "seatgate-py", requests_stream: str = REQUESTS_STREAM,
                 shards: int = 1, reply_prefix: str = REPLY_PREFIX):
        # `r` must be created with decode_responses=True.
        self.r = r
        self.requests_stream = requests_stream
        self.shards = shards
        # One reply stream per client.
        self.reply_to = reply_stream(reply_prefix, app)
        self.last_seen = "0-0"  # last reply entry read from our stream
        # The lease each (license, session) is bound to, sent with its later requests.
        self.leases = Leases()

    def lease(self, license, session):
        """The lease this client holds for the session, or None."""
        return self.leases.get(license, session)

    def acquire(self, license, session, meta=None, wait_s=0.0, timeout=5.0, on_queued=None, lease=None, user=None,
                group=None, priority=0, borrow_s=0.0):
        """Takes a seat for `user` (None: nobody in particular), waiting up to
        `wait_s` seconds in the license's queue when none is free, bound to
        `lease` (default: the one held for the session, else a new random
        one). Returns the final reply; `on_queued(reply)` is called with the
        QUEUED reply, if any."""
        extra = acquire_fields(self.leases.bind(license, session, lease), meta, wait_s, user, group, priority, borrow_s)
        reply = self.call("acquire", license, session, extra, timeout)
        if reply["status"] == "QUEUED":
            if on_queued:
                on_queued(reply)
            # The final answer carries the same id; skip repeats of QUEUED.
            reply = self.wait_for(reply["id"], wait_s + timeout + QUEUE_MARGIN_S, final=True)
        return reply

    def heartbeat(self, license, session, timeout=5.0):
        """Keeps the session's seat alive, with the lease it was acquired with."""
        return self.call("heartbeat", license, session, self.leases.field(license, session), timeout)

    def release(self, license, session, timeout=5.0):
        """Gives the session's seat back (or leaves the queue), with its lease."""
        reply = self.call("release", license, session, self.leases.field(license, session), timeout)
        self.leases.settle(license, session, reply)
        return reply

    def call(self, op, license, session, extra, timeout):
        """Sends one request and returns its first reply as a dict of strings.
        It carries ttl_ms = `timeout`: one not decided by then never will be
        (REQUEST_EXPIRED), so a caller may send it again."""
        deadline = time.monotonic() + timeout
        request_id = uuid.uuid4().hex
        request = request_fields(op, request_id, license, session, self.reply_to, {**extra, **ttl_field(timeout)})
        # XADD and the first XREAD BLOCK in one round trip: Redis runs one
        # connection's commands in order, so the read starts after the request
        # is on the stream, and usually returns with the reply.
        pipe = self.r.pipeline(transaction=False)
        pipe.xadd(self.stream_for(license), request)
        self._read(pipe, timeout)
        _, read = pipe.execute()
        return self._match(read, request_id) or self.wait_for(request_id, deadline - time.monotonic())

    def stream_for(self, license):
        """The requests stream (shard) that serves `license`."""
        return stream_for(self.requests_stream, self.shards, license)

    def wait_for(self, request_id, timeout, final=False):
        """Reads our reply stream until the reply to `request_id` arrives (with
        `final`, one that is not QUEUED). Replies to other ids (an earlier call
        that timed out) are skipped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            read = self._read(self.r, deadline - time.monotonic())
            reply = self._match(read, request_id, final)
            if reply:
                return reply
        raise ReplyTimeout(f"no reply to request {request_id} in time")

    def _read(self, r, timeout):
        # Block in slices of at most 1 s: BLOCK 0 would mean "forever", and a
        # long block would trip redis-py's socket_timeout (5 s by default).
        block_ms = max(1, min(int(timeout * 1000), 1000))
        return r.xread({self.reply_to: self.last_seen}, count=100, block=block_ms)

    def _match(self, read, request_id, final=False):
        found = None
        for _stream, entries in read or []:
            for entry_id, fields in entries:
                self.last_seen = entry_id
                if found is None and fields.get("id") == request_id:
                    if not (final and fields.get("status") == "QUEUED"):
                        found = fields
        return found

    def close(self):
        """Deletes the reply stream (it would otherwise expire by itself)."""
        self.r.delete(self.reply_to)


def discover_shards(r):
    """The requests stream's shard count, as the workers recorded it (HGET
    seat:config shards); 1 when none is recorded yet."""
    return int(r.hget(CONFIG_KEY, "shards") or 1)


def heartbeat_interval(reply):
    """Seconds between heartbeats for the seat `reply` gave or kept: a third
    of the license's heartbeat timeout (`heartbeat_timeout_ms`, on ACQUIRED,
    ALREADY_ACTIVE, GRANTED and HEARTBEAT_UPDATED), so one lost or late
    heartbeat never costs the seat; 1 s from a service too old to say."""
    timeout_ms = int(reply.get("heartbeat_timeout_ms") or 3000)
    return timeout_ms / 3000.0


def show(label, reply):
    print(f"{label:<10} {json.dumps(reply)}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Acquire, heartbeat twice and release a seatgate seat.")
    add_common_args(parser)
    parser.add_argument("--session", default=f"py-{uuid.uuid4().hex[:12]}", help="session id (default: random)")
    parser.add_argument("--wait", type=float, default=0.0, help="seconds to wait in the queue when no seat is free (default: 0)")
    parser.add_argument("--interval", type=float, default=None,
                        help="seconds between heartbeats (default: a third of the heartbeat timeout the acquire's reply names)")
    parser.add_argument("--shards", type=int, default=None,
                        help="the service's stream.shards (default: what the workers recorded in seat:config, else 1)")
    parser.add_argument("--lease", default=None,
                        help="bind the seat to this lease (default: a new random one); it is printed after the acquire")
    args = parser.parse_args(argv)

    password = redis_password()
    r = redis.Redis.from_url(args.redis_url, decode_responses=True, **({"password": password} if password else {}))
    client = SeatClient(r, app=args.app, requests_stream=requests_stream_of(args),
                        shards=args.shards or discover_shards(r))
    try:
        reply = client.acquire(args.license, args.session, meta={"client": "python_client.py"},
                               wait_s=args.wait, on_queued=lambda r: show("queued", r), lease=args.lease,
                               user=args.user)
        show("acquire", reply)
        if reply.get("ok") != "1":
            return 1
        # The lease is the one secret of the seat: shown to whoever runs this, nowhere else.
        print(f"{'lease':<10} {client.lease(args.license, args.session)}", flush=True)
        interval = args.interval
        if interval is None:
            # ACQUIRED and GRANTED name the license's heartbeat timeout: no
            # copy of the service's settings needed.
            interval = heartbeat_interval(reply)
        try:
            for _ in range(2):
                time.sleep(interval)
                beat = client.heartbeat(args.license, args.session)
                show("heartbeat", beat)
                if args.interval is None and beat.get("heartbeat_timeout_ms"):
                    # An operator may have changed the license's timeout:
                    # each heartbeat's reply names the one in force.
                    interval = heartbeat_interval(beat)
        finally:
            show("release", client.release(args.license, args.session))
        return 0
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ReplyTimeout, redis.RedisError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    finally:
        try:
            client.close()
        except redis.RedisError:
            pass


if __name__ == "__main__":
    sys.exit(main())
