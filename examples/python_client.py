"""A minimal seatgate client in Python: acquire, heartbeat and release a seat.

It speaks the wire protocol of docs/protocol.md directly with redis-py: each
call XADDs a request (with a unique `id` and this client's own `reply_to`
stream) to `seat:requests`, then XREADs the reply stream until the reply
carrying that id arrives, or the timeout passes.

Run it against a Redis with a `seatgate run` worker and a provisioned license:

    pip install redis
    seatgate --redis redis://127.0.0.1:6379 license put demo --seats 2
    seatgate --redis redis://127.0.0.1:6379 run &
    python3 examples/python_client.py --redis-url redis://127.0.0.1:6379 \
        --license demo --session laptop-42

It prints each reply, and exits 1 when the acquire was refused (for example
NO_SEATS_AVAILABLE), 3 when Redis or the worker did not answer, 0 otherwise.
"""

import argparse
import json
import sys
import time
import uuid

import redis

REQUESTS_STREAM = "seat:requests"


class ReplyTimeout(Exception):
    """No reply arrived in time: is a `seatgate run` worker serving this Redis?"""


class SeatClient:
    """Sends seat requests and waits for their replies on a private stream."""

    def __init__(self, r: redis.Redis, requests_stream: str = REQUESTS_STREAM):
        # `r` must be created with decode_responses=True.
        self.r = r
        self.requests_stream = requests_stream
        # One reply stream per client. It must not start with "seat:" (the
        # service's own namespace); the worker caps it and lets it expire.
        self.reply_to = f"reply:seatgate-py:{uuid.uuid4().hex}"
        self.last_seen = "0-0"  # last reply entry read from our stream

    def acquire(self, license, session, meta=None, wait_ms=0, timeout=5.0):
        """Takes a seat. `meta` is a dict stored with the session."""
        fields = {}
        if meta is not None:
            fields["meta"] = json.dumps(meta, separators=(",", ":"))
        if wait_ms:
            # Accepted by the service; see docs/protocol.md for its current effect.
            fields["wait_ms"] = str(int(wait_ms))
        return self.call("acquire", license, session, fields, timeout + wait_ms / 1000)

    def heartbeat(self, license, session, timeout=5.0):
        """Keeps the session's seat alive."""
        return self.call("heartbeat", license, session, {}, timeout)

    def release(self, license, session, timeout=5.0):
        """Gives the session's seat back."""
        return self.call("release", license, session, {}, timeout)

    def call(self, op, license, session, extra, timeout):
        """XADDs one request and returns its reply as a dict of strings."""
        request_id = uuid.uuid4().hex
        request = {
            "op": op,
            "id": request_id,
            "license": license,
            "session": session,
            "reply_to": self.reply_to,
            **extra,
        }
        self.r.xadd(self.requests_stream, request)
        return self.wait_for(request_id, timeout)

    def wait_for(self, request_id, timeout):
        """Reads our reply stream until the reply to `request_id` arrives.

        Replies to other ids (an earlier call that timed out, or a duplicate
        after a worker restart) are skipped.
        """
        deadline = time.monotonic() + timeout
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise ReplyTimeout(f"no reply to request {request_id} within {timeout:g}s")
            # Block in slices of at most 1 s: BLOCK 0 would mean "forever", and
            # a long block would trip the connection's socket_timeout (5 s by
            # default in redis-py 8).
            block_ms = max(1, min(left_ms, 1000))
            read = self.r.xread({self.reply_to: self.last_seen}, count=100, block=block_ms)
            for _stream, entries in read or []:
                for entry_id, fields in entries:
                    self.last_seen = entry_id
                    if fields.get("id") == request_id:
                        return fields

    def close(self):
        """Deletes the reply stream (it would otherwise expire by itself)."""
        self.r.delete(self.reply_to)


def show(label, reply):
    print(f"{label:<10} {json.dumps(reply)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Acquire, heartbeat twice and release a seatgate seat.")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379", help="Redis URL (default: %(default)s)")
    parser.add_argument("--license", required=True, help="license id, e.g. demo")
    parser.add_argument("--session", default=f"py-{uuid.uuid4().hex[:12]}", help="session id (default: random)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between heartbeats (default: 1)")
    args = parser.parse_args(argv)

    client = SeatClient(redis.Redis.from_url(args.redis_url, decode_responses=True))
    try:
        reply = client.acquire(args.license, args.session, meta={"client": "python_client.py"})
        show("acquire", reply)
        if reply.get("ok") != "1":
            return 1
        try:
            for _ in range(2):
                time.sleep(args.interval)
                show("heartbeat", client.heartbeat(args.license, args.session))
        finally:
            show("release", client.release(args.license, args.session))
        return 0
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
