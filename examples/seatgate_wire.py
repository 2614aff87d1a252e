"""What the example Python clients share: the wire protocol's names and
rules (docs/protocol.md), the shard a license's requests go to, and the
leases a client keeps per session. python_client.py and
python_async_client.py import it; run either from any directory, Python
finds this file beside them.
"""

import argparse
import getpass
import json
import os
import re
import secrets
import uuid
import zlib

REQUESTS_STREAM = "seat:requests"
# Where the workers record settings every client must agree with (`shards`).
CONFIG_KEY = "seat:config"
# The service's replies.prefix: a reply_to outside it is never answered (the
# request is dead-lettered instead).
REPLY_PREFIX = "seat:reply:"
# A QUEUE_TIMEOUT can come up to a reaper period (5 s by default) after the
# wait ran out, later still if its first delivery failed: allow for it.
QUEUE_MARGIN_S = 30.0
# What the service takes as a lease.
LEASE_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
# What the service takes as an id: a session, a user, a group.
ID_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
# Replies after which the session's seat or place is given back (or was never held).
GIVEN_BACK = {"RELEASED", "LEFT_QUEUE", "SESSION_NOT_FOUND"}
# Replies by which the session holds a seat.
GRANTS = {"ACQUIRED", "ALREADY_ACTIVE", "GRANTED"}
# A request that reached a worker after its ttl_ms: nothing changed, send it
# again (under a new id).
REQUEST_EXPIRED = "REQUEST_EXPIRED"
# Replies to a heartbeat that decide nothing about the seat: try again sooner.
RETRY_LATER = {"RATE_LIMITED", "ERROR"}
# What a client assumes when a grant carries no heartbeat_timeout_ms (the
# service's default, sessions.heartbeat_timeout_ms).
DEFAULT_HEARTBEAT_TIMEOUT_S = 90.0


class ReplyTimeout(Exception):
    """No reply arrived in time: is a `seatgate run` worker serving this Redis?"""


def reply_stream(reply_prefix, app):
    """A new client's reply stream: inside the service's reply namespace and
    under the application's name (its ACL user may read only <prefix><app>:*).
    The random part keeps it unguessable, so nobody else can aim replies at
    it. The worker trims replies older than replies.ttl_ms and lets the
    stream expire once idle."""
    return f"{reply_prefix}{app}:{uuid.uuid4().hex}"


def app_requests_stream(app, requests_stream=REQUESTS_STREAM):
    """Application `app`'s own requests stream, `<stream.requests>:app:<app>`,
    for a service whose stream.applications lists it (docs/protocol.md): its
    ACL user may write there and nowhere else."""
    return f"{requests_stream}:app:{app}"


def requests_stream_of(args):
    """The requests stream the command line asks for: the application's own
    with --own-stream, else the shared one."""
    return app_requests_stream(args.app) if args.own_stream else REQUESTS_STREAM


def stream_for(requests_stream, shards, license):
    """The requests stream (shard) that serves `license`: with `stream.shards`
    = N > 1, `<stream>:{i}`, i = crc32(license) % N (docs/protocol.md, "Shards
    and Redis Cluster")."""
    if shards <= 1:
        return requests_stream
    return f"{requests_stream}:{{{zlib.crc32(license.encode()) % shards}}}"


def request_fields(op, request_id, license, session, reply_to, extra):
    """One request entry's fields, every value a string."""
    return {"op": op, "id": request_id, "license": license, "session": session,
            "reply_to": reply_to, **{k: str(v) for k, v in extra.items()}}


def ttl_field(ttl_s):
    """The `ttl_ms` field: the request is decided within `ttl_s` seconds of
    reaching Redis or not at all (REQUEST_EXPIRED). Keep it at most the reply
    timeout, so that a request given up on can no longer be decided after the
    one sent in its place."""
    return {"ttl_ms": str(max(1, int(ttl_s * 1000)))}


def heartbeat_timeout_s(reply, default):
    """The license's heartbeat timeout in seconds, from a reply that carries
    it (ACQUIRED, ALREADY_ACTIVE, GRANTED, HEARTBEAT_UPDATED), else `default`."""
    try:
        ms = int(reply.get("heartbeat_timeout_ms", ""))
    except ValueError:
        return default
    return ms / 1000 if ms > 0 else default


def clock_age_s(reply, reply_entry_id):
    """How long before its writing the seat's heartbeat clock started, both
    on Redis's clock: the reply entry's id against its `held_since_ms`. None
    when the reply does not carry it."""
    try:
        held_since = int(reply["held_since_ms"])
        written = int(reply_entry_id.split("-")[0])
    except (KeyError, ValueError):
        return None
    return max(0, written - held_since) / 1000


def redis_password():
    """The Redis password from SEATGATE_REDIS_PASSWORD, or None: a password in
    the URL would be on the command line."""
    return os.environ.get("SEATGATE_REDIS_PASSWORD") or None


class Leases:
    """The lease each (license, session) is bound to (docs/protocol.md,
    "Leases"): made (or taken from the caller) at the acquire, sent with the
    session's heartbeats, releases and re-sent acquires, forgotten once the
    seat or place is given back."""

    def __init__(self):
        self._by_session = {}

    def get(self, license, session):
        """The lease held for the session, or None."""
        return self._by_session.get((license, session))

    def bind(self, license, session, lease=None):
        """The lease an acquire of the session carries: `lease`, else the one
        held for the session, else a new random one. Raises ValueError for a
        lease the service would refuse."""
        if lease is None:
            # 32 hex digits from the OS's randomness: within the lease's
            # charset, and never starting with "-", which a command line
            # (seatgate --lease) would take for an option.
            lease = self.get(license, session) or secrets.token_hex(16)
        if not LEASE_RE.fullmatch(lease):
            raise ValueError("a lease is 16 to 128 characters of A-Z a-z 0-9 _ -")
        self._by_session[(license, session)] = lease
        return lease

    def field(self, license, session):
        """The `lease` field of the session's heartbeat or release ({} when
        none is held)."""
        lease = self.get(license, session)
        return {"lease": lease} if lease else {}

    def settle(self, license, session, reply):
        """Forgets the session's lease when `reply` (to a release) says the
        seat or place is given back."""
        if reply.get("status") in GIVEN_BACK:
            self._by_session.pop((license, session), None)


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


def acquire_fields(lease, meta=None, wait_s=0.0, user=None, group=None, priority=0, borrow_s=0.0):
    """An acquire's own fields: its lease, the `user` the seat counts for
    (the one `seatgate status` shows, and the license's per-user policies
    count; `meta` is display data only), the user's `group` (group limits
    and reservations), the queue `priority` (0-9, capped by the license's
    max_priority), a borrow of `borrow_s` seconds (held without heartbeats,
    within the license's max_borrow_ms), `meta` as compact JSON, and the
    queue wait in ms when it may wait (docs/protocol.md, "Policies")."""
    fields = {"lease": lease}
    if user is not None:
        fields["user"] = user
    if group is not None:
        fields["group"] = group
    if priority:
        fields["priority"] = str(int(priority))
    if borrow_s > 0:
        fields["borrow_ms"] = str(int(borrow_s * 1000))
    if meta is not None:
        fields["meta"] = json.dumps(meta, separators=(",", ":"))
    if wait_s > 0:
        fields["wait_ms"] = str(int(wait_s * 1000))
    return fields


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
                        help="send to the application's own requests stream, seat:requests:app:<app> (the service "
                             "lists the application in stream.applications; its ACL user may write nowhere else)")
