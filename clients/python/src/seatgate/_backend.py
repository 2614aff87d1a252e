"""What the seat handle needs from a transport (Redis Streams or the HTTPS
gateway): an acquire carried through timeouts, heartbeats and releases."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from typing import Protocol

from .wire import Received, Reply

#: Where the package's diagnostics go: ``logger(level, message)`` with level
#: ``"debug"``, ``"info"`` or ``"warn"``.
Logger = Callable[[str, str], None]


@dataclass(frozen=True)
class SeatTarget:
    """The seat (or place in the queue) a request is about."""

    license: str
    session: str
    lease: str


@dataclass(frozen=True)
class AcquireSpec:
    """An acquire as the seat handle asks for it."""

    license: str
    session: str
    #: The caller's lease; the Redis transport makes one when absent.
    lease: Optional[str]
    user: Optional[str]
    group: Optional[str]
    priority: Optional[int]
    borrow_ms: Optional[int]
    wait_ms: int
    meta: Optional[Mapping[str, Any]]


@dataclass(frozen=True)
class Timing:
    """Timing shared by the client, its transports and its seats (ms)."""

    #: How long a reply is waited for before the request goes again under a new id.
    request_timeout_ms: float
    #: The ttl_ms every request carries.
    ttl_ms: int
    #: How long an acquire goes on sending before it gives up; a release goes on at least this long.
    give_up_after_ms: float
    #: The heartbeat timeout assumed when a reply carries none.
    default_heartbeat_timeout_ms: float


class AcquireAttempt(Protocol):
    """One acquire: its attempts, and every reply to any of them."""

    @property
    def lease(self) -> str: ...

    @property
    def attempts(self) -> int: ...

    @property
    def first_sent_at(self) -> float: ...

    async def first(self, give_up_at: float, stop: Optional[asyncio.Event] = None) -> Optional[Received]:
        """The first final-or-QUEUED answer (never REQUEST_EXPIRED), sending
        again after each request timeout without one; None when `stop` is
        set. Raises SeatgateError TIMEOUT at `give_up_at`."""
        ...

    async def next(self, until_ms: float, stop: Optional[asyncio.Event] = None) -> Optional[Received]:
        """The next reply to any attempt, or None at `until_ms`."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    @property
    def where(self) -> str:
        """Where it talks to, for messages ("Redis at redis://...")."""
        ...

    def start_acquire(self, spec: AcquireSpec) -> AcquireAttempt: ...

    async def heartbeat(
        self, target: SeatTarget, stop: Optional[asyncio.Event], until_ms: Optional[float]
    ) -> Optional[Received]:
        """One heartbeat, sent again under new ids until answered (never
        REQUEST_EXPIRED); None when `stop` is set or `until_ms` passes first."""
        ...

    async def release(self, target: SeatTarget, until_ms: float) -> Optional[Reply]:
        """One release, sent again (same lease, every attempt listened to)
        until answered or `until_ms`: None when nothing answered by then."""
        ...

    async def close(self) -> None: ...
