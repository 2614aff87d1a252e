"""A minimal seatgate client in Python: acquire a seat (waiting in the queue
if asked), heartbeat it twice and release it, printing each reply.

It uses the `seatgate` package (clients/python), from synchronous code:
`seatgate.sync.Client` runs the asyncio seat handle on a thread of its own.
The handle does what docs/protocol.md ("Writing a client") asks of a
client: every request carries the seat's lease and ttl_ms, one unanswered
is sent again, a QUEUED acquire waits for its GRANTED (heartbeating to keep
its place, and claiming the grant at once), the seat heartbeats itself at a
third of its heartbeat timeout, and the release is honest. The shard count
(`stream.shards`) and the application's own requests stream come from what
the workers record in the HASH `seat:config`.

This example also heartbeats by hand (`seat.heartbeat()`), twice, every
--interval seconds (default: a third of the heartbeat timeout the acquire's
reply names), to show the replies.

Every acquire carries a lease (docs/protocol.md, "Leases"): a random secret
the seat is bound to. The handle makes one per acquire (or takes the
caller's, --lease) and sends it with that session's heartbeats and release;
nobody without it can release or keep alive the seat. It prints the lease,
never logs it elsewhere; pass it back with --lease to pick up a seat after a
restart.

Run it against a Redis with a `seatgate run` worker and a provisioned license:

    pip install ./clients/python    # or run from the repository: it finds the package
    seatgate --redis redis://127.0.0.1:6379 license put demo --seats 1
    seatgate --redis redis://127.0.0.1:6379 run &
    python3 examples/python_client.py --redis-url redis://127.0.0.1:6379 --license demo &
    python3 examples/python_client.py --redis-url redis://127.0.0.1:6379 --license demo --wait 30

With ops/redis-users.acl installed, log in as the application's client user
(the password from the environment, so that it is on no command line) and
give the application name its ACL key pattern allows (seat:reply:demo:*);
when the workers list the application in stream.applications, its requests
go to its own stream, seat:requests:app:demo:

    SEATGATE_REDIS_PASSWORD=... python3 examples/python_client.py \
        --redis-url redis://seatgate-client-demo@127.0.0.1:6379 --app demo --license demo

Each acquire names the user its seat counts for, in the `user` field: --user,
else your OS login name. `seatgate status` shows it in its USER column (the
`meta` sent along is display data, never the user). The second copy finds the
only seat taken, prints QUEUED, and gets GRANTED when the first releases. It
prints each reply, and exits 1 when the acquire was refused
(NO_SEATS_AVAILABLE, QUEUE_TIMEOUT, ...), 2 for a malformed --lease, 3 when
Redis or the worker did not answer, 0 otherwise.
"""

import argparse
import getpass
import json
import os
import re
import sys
import time
import uuid

try:
    import seatgate
except ImportError:  # run from the repository: the package is beside it
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python", "src"))
    import seatgate
import seatgate.sync

# What the service takes as an id: a session, a user, a group.
ID_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")


def default_user():
    """The user a session counts for when none is given: the OS login name
    (as `seatgate revoke --actor` defaults to it), or None when there is
    none or it is not an id the service takes."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        return None
    return name if ID_RE.fullmatch(name) else None


def user_id(text):
    """argparse type of --user: an id the service takes."""
    if not ID_RE.fullmatch(text):
        raise argparse.ArgumentTypeError("a user is 1 to 128 characters of A-Z a-z 0-9 . _ : @ -")
    return text


def add_common_args(parser):
    """The command-line options both examples take."""
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379", help="Redis URL (default: %(default)s)")
    parser.add_argument("--license", required=True, help="license id, e.g. demo")
    parser.add_argument("--user", type=user_id, default=default_user(),
                        help="the user the seats count for, sent as the acquire's `user` (seatgate status shows it; "
                             "default: your OS login name)")
    parser.add_argument("--app", default="seatgate-py",
                        help="application name in the reply stream's name; its ACL user's pattern (default: %(default)s)")
    parser.add_argument("--own-stream", action="store_true",
                        help="kept for old command lines: the package sends to the application's own requests stream, "
                             "seat:requests:app:<app>, by itself when the workers list it in stream.applications")


def show(label, reply):
    print(f"{label:<10} {json.dumps(dict(reply))}", flush=True)


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

    try:
        client = seatgate.sync.Client.connect(args.redis_url, application=args.app, shards=args.shards)
    except seatgate.SeatgateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    try:
        try:
            seat = client.acquire_seat(args.license, session=args.session, user=args.user, lease=args.lease,
                                       wait_ms=int(args.wait * 1000), meta={"client": "python_client.py"},
                                       on_queued=lambda position, reply: show("queued", reply))
        except seatgate.SeatgateError as e:
            if e.code == "INVALID_ARGUMENT":
                print(f"error: {e}", file=sys.stderr)
                return 2
            if e.reply is not None:  # refused: the service's answer
                show("acquire", e.reply)
                return 1
            print(f"error: {e}", file=sys.stderr)
            return 3
        show("acquire", seat.grant)
        # The lease is the one secret of the seat: shown to whoever runs this, nowhere else.
        print(f"{'lease':<10} {seat.lease}", flush=True)
        try:
            for _ in range(2):
                # An operator may have changed the license's timeout: each
                # heartbeat's reply names the one in force.
                time.sleep(args.interval if args.interval is not None else seat.heartbeat_timeout_ms / 3000)
                beat = seat.heartbeat()
                if beat is None:
                    break
                show("heartbeat", beat)
                if seat.state != "held":
                    break
        finally:
            gone = seat.release()
            show("release", gone.reply if gone.reply is not None else {"status": "UNKNOWN"})
        return 0
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
