"""The wire protocol's names and rules (docs/protocol.md) that the seat
handle and its transports share: statuses, replies, leases, ids, the shard
of a license, and when the first heartbeat is due."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
import zlib
from dataclasses import dataclass
from typing import Dict, Generic, List, Mapping, Optional, TypeVar

#: A reply as the service wrote it: every field a string (docs/protocol.md, "Replies").
Reply = Mapping[str, str]

#: Statuses after which the session holds a seat.
GRANTS = frozenset({"ACQUIRED", "ALREADY_ACTIVE", "GRANTED"})
#: Statuses of a release that gave the seat (or the place in the queue) back.
GAVE_BACK = frozenset({"RELEASED", "LEFT_QUEUE"})
#: Replies that decide nothing about the seat: try again sooner.
RETRY_LATER = frozenset({"RATE_LIMITED", "ERROR"})
#: A request read after its ttl_ms: nothing changed, send it again under a new id.
REQUEST_EXPIRED = "REQUEST_EXPIRED"

#: What a client assumes when a reply carries no heartbeat_timeout_ms (the
#: service's default, sessions.heartbeat_timeout_ms).
DEFAULT_HEARTBEAT_TIMEOUT_MS = 90_000
#: How much longer than its wait_ms a queued acquire waits for its final
#: reply: a QUEUE_TIMEOUT can come a reaper period late, later still when its
#: first delivery failed.
QUEUE_MARGIN_MS = 30_000
#: The shortest pause between heartbeats, whatever the timeout says.
MIN_PAUSE_MS = 10
#: How long the service answers the same request id with its first answer
#: (dedupe.window_ms): an XADD that failed ambiguously is sent again under
#: the same id only this long after its first attempt.
DEDUPE_WINDOW_MS = 60_000

_LEASE_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_ID_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
_APP_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")

ID_RULE = "1 to 128 characters of A-Z a-z 0-9 . _ - : @"
LEASE_RULE = "a lease is 16 to 128 characters of A-Z a-z 0-9 _ -"
APP_RULE = "an application is 1 to 64 characters of A-Z a-z 0-9 . _ -"


def now_ms() -> float:
    """This process's monotonic clock, ms: every deadline of the package."""
    return time.monotonic() * 1000.0


def new_lease() -> str:
    """A new lease: 32 hex digits from the OS's randomness (docs/protocol.md,
    "Leases"); never starts with "-", which a command line would take for an
    option."""
    return secrets.token_hex(16)


def random_hex(nbytes: int) -> str:
    """Random hex, `nbytes` bytes of it."""
    return secrets.token_hex(nbytes)


def is_lease(lease: str) -> bool:
    """Whether `lease` is one the service takes."""
    return _LEASE_RE.fullmatch(lease) is not None


def is_id(value: str) -> bool:
    """Whether `value` is a license, session, user or group id the service takes."""
    return _ID_RE.fullmatch(value) is not None


def is_application(value: str) -> bool:
    """Whether `value` is an application name (its reply streams and own requests stream)."""
    return _APP_RE.fullmatch(value) is not None


def int_field(reply: Reply, name: str) -> Optional[int]:
    """A whole number field of a reply, or None."""
    raw = reply.get(name)
    if raw is None or not raw.isdigit():
        return None
    return int(raw)


def heartbeat_timeout_ms(reply: Reply, fallback: float) -> float:
    """The heartbeat timeout a reply carries, else `fallback`."""
    ms = int_field(reply, "heartbeat_timeout_ms")
    return float(ms) if ms is not None and ms > 0 else fallback


def first_pause_ms(grant: Reply, timeout_ms: float, written_ms: Optional[int], since_first_sent_ms: float) -> float:
    """How long the first heartbeat waits after a grant: a third of the
    timeout after the seat's heartbeat clock started (docs/protocol.md,
    "Heartbeats"). `written_ms` is the reply entry's time on Redis's clock
    (its stream id), `since_first_sent_ms` how long ago the acquire's first
    attempt went out."""
    held_since = int_field(grant, "held_since_ms")
    if held_since is not None and written_ms is not None:
        age = float(max(0, written_ms - held_since))
    elif grant.get("status") == "ALREADY_ACTIVE":
        age = timeout_ms  # its clock may be older than this acquire: at once
    else:
        age = since_first_sent_ms
    return max(0.0, timeout_ms // 3 - age)


def crc32(text: str) -> int:
    """CRC-32 (IEEE, zlib's) of `text` as UTF-8: the shard of a license."""
    return zlib.crc32(text.encode("utf-8")) & 0xFFFFFFFF


def shard_of(base: str, shards: int, license: str) -> str:
    """The stream (shard) of `base` that serves `license` with `shards` shards."""
    return f"{base}:{{{crc32(license) % shards}}}" if shards > 1 else base


def entry_ms(entry_id: str) -> Optional[int]:
    """The time (Redis's clock, ms) in a stream entry id, or None."""
    head = entry_id.split("-", 1)[0]
    return int(head) if head.isdigit() else None


@dataclass(frozen=True)
class Received:
    """A reply and when it was written, on Redis's clock (its reply stream
    entry's id), when known."""

    reply: Reply
    written_ms: Optional[int] = None


T = TypeVar("T")


class Inbox(Generic[T]):
    """Replies to one request (all its attempts), in arrival order, read with
    a deadline by one reader at a time. A transport pushes, the seat handle
    pulls."""

    def __init__(self) -> None:
        self._items: List[T] = []
        self._wake: Optional[asyncio.Future[None]] = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, item: T) -> None:
        if self._closed:
            return
        self._items.append(item)
        self._notify()

    def close(self) -> None:
        """Ends every wait: `next` answers None from now on."""
        self._closed = True
        self._notify()

    def _notify(self) -> None:
        wake = self._wake
        self._wake = None
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def next(self, until_ms: float, stop: Optional[asyncio.Event] = None) -> Optional[T]:
        """The next item, or None once `until_ms` (now_ms() time) passes,
        `stop` is set or the inbox closes."""
        while True:
            if self._items:
                return self._items.pop(0)
            if self._closed or (stop is not None and stop.is_set()):
                return None
            left = until_ms - now_ms()
            if left <= 0:
                return None
            loop = asyncio.get_running_loop()
            wake: asyncio.Future[None] = loop.create_future()
            self._wake = wake
            waits: List[asyncio.Future[object]] = [wake]  # type: ignore[list-item]
            stopper: Optional[asyncio.Task[bool]] = None
            if stop is not None:
                stopper = asyncio.ensure_future(stop.wait())
                waits.append(stopper)  # type: ignore[arg-type]
            try:
                await asyncio.wait(waits, timeout=left / 1000.0, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if stopper is not None and not stopper.done():
                    stopper.cancel()
                if self._wake is wake:
                    self._wake = None
                if not wake.done():
                    wake.cancel()


async def sleep_ms(ms: float, stop: Optional[asyncio.Event] = None) -> None:
    """Sleeps `ms`, or less when `stop` is set (never raises but for cancellation)."""
    if ms <= 0:
        await asyncio.sleep(0)
        return
    if stop is None:
        await asyncio.sleep(ms / 1000.0)
        return
    if stop.is_set():
        return
    try:
        await asyncio.wait_for(stop.wait(), ms / 1000.0)
    except asyncio.TimeoutError:
        pass


def fields_of(flat: Mapping[str, str]) -> Dict[str, str]:
    """A reply entry's fields as a plain dict of strings."""
    return {str(k): str(v) for k, v in flat.items()}
