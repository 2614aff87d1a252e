"""The seat handle: a seat that keeps itself (docs/protocol.md, "What the
seat handles do"), the same semantics as the TypeScript package's.

``acquire_seat`` returns once the session holds a seat: at once, or after
waiting in the queue, heartbeating while it waits (the wait queue's waiter
liveness) and claiming a GRANTED at once with a heartbeat. From then on the
Seat heartbeats at a third of the latest heartbeat_timeout_ms, says when the
service takes the seat (``seat.lost()``), and gives it back with an honest
``release()``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Protocol

from ._backend import AcquireAttempt, AcquireSpec, Backend, Logger, SeatTarget, Timing
from .errors import ABORTED, CLOSED, INVALID_ARGUMENT, TIMEOUT, SeatgateError, describe
from .wire import (
    GAVE_BACK,
    GRANTS,
    ID_RULE,
    LEASE_RULE,
    MIN_PAUSE_MS,
    QUEUE_MARGIN_MS,
    RETRY_LATER,
    Received,
    Reply,
    first_pause_ms,
    heartbeat_timeout_ms,
    int_field,
    is_id,
    is_lease,
    now_ms,
    random_hex,
    sleep_ms,
)

#: Told the place in the queue, and the reply that said it (the QUEUED
#: answer to the acquire, or to a waiter heartbeat).
OnQueued = Callable[[int, Reply], Any]


@dataclass(frozen=True)
class SeatLoss:
    """Why the service took a seat."""

    #: The status that said so: SESSION_NOT_ACTIVE (evicted), SESSION_REVOKED, LEASE_MISMATCH, ...
    status: str
    #: Its ``error`` text ("" when none).
    error: str
    #: The whole reply, when there was one.
    reply: Optional[Reply] = None


@dataclass(frozen=True)
class ReleaseResult:
    """What a release learnt; never ``unknown`` for a release that was answered.

    - ``released``: the service gave the seat back (RELEASED) or took the
      session out of the queue (LEFT_QUEUE);
    - ``already_gone``: the seat was no longer the session's
      (SESSION_NOT_FOUND, SESSION_REVOKED, LEASE_MISMATCH, ...), `reply` says why;
    - ``unknown``: no attempt was answered before the seat's heartbeat
      timeout ran out since its last heartbeat: if none ever arrives, the
      seat has been evicted by then.
    """

    outcome: Literal["released", "already_gone", "unknown"]
    reply: Optional[Reply] = None


SeatState = Literal["held", "lost", "released"]


class SeatOwner(Protocol):
    """What the client keeps for its seats."""

    @property
    def backend(self) -> Backend: ...

    @property
    def timing(self) -> Timing: ...

    @property
    def log(self) -> Logger: ...

    def adopt(self, seat: "Seat") -> None: ...

    def disown(self, seat: "Seat") -> None: ...

    def track(self, task: "asyncio.Future[Any]") -> None:
        """Keeps an undo running in the background, so that close() can wait for it."""
        ...


class Seat:
    """A seat the session holds, kept by a heartbeat task of its own.

    ``async with seat:`` releases it on the way out. Listeners:
    ``seat.on("heartbeat" | "lost" | "released", callback)``.
    """

    def __init__(
        self, owner: SeatOwner, target: SeatTarget, grant: Reply, timeout_ms: float, first_pause: float
    ) -> None:
        self._owner = owner
        self.license = target.license
        self.session = target.session
        #: The lease the seat is bound to: keep it to take the seat back after a restart.
        self.lease = target.lease
        #: The reply that gave the seat (ACQUIRED, ALREADY_ACTIVE or GRANTED).
        self.grant: Reply = grant
        self._state: SeatState = "held"
        self._timeout_ms = timeout_ms
        self._heartbeats = 0
        self._loss: Optional[SeatLoss] = None
        self._last_beat_at = now_ms()
        self._stop = asyncio.Event()
        self._beat_lock = asyncio.Lock()
        self._rescheduled = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._lost: asyncio.Future[SeatLoss] = loop.create_future()
        self._first_beat: asyncio.Future[Optional[SeatLoss]] = loop.create_future()
        self._releasing: Optional[asyncio.Future[ReleaseResult]] = None
        self._listeners: Dict[str, List[Callable[..., Any]]] = {}
        owner.adopt(self)
        self._task = asyncio.ensure_future(self._heartbeat_loop(first_pause))

    @property
    def state(self) -> SeatState:
        """``held``, ``lost`` (the service took it) or ``released``."""
        return self._state

    @property
    def heartbeat_timeout_ms(self) -> float:
        """The heartbeat timeout the service last gave, ms; the handle heartbeats at a third of it."""
        return self._timeout_ms

    @property
    def heartbeats(self) -> int:
        """Heartbeats answered HEARTBEAT_UPDATED so far."""
        return self._heartbeats

    @property
    def loss(self) -> Optional[SeatLoss]:
        """Why the seat was lost, once it was."""
        return self._loss

    @property
    def lost_status(self) -> Optional[str]:
        """The status that took the seat, once it was lost."""
        return self._loss.status if self._loss is not None else None

    def lost(self) -> "asyncio.Future[SeatLoss]":
        """A future done when the service takes the seat (never when it is
        released): ``loss = await seat.lost()``."""
        return self._lost

    @property
    def first_heartbeat(self) -> "asyncio.Future[Optional[SeatLoss]]":
        """Done after the first heartbeat's answer: None when it kept the seat, else the loss."""
        return self._first_beat

    def on(self, event: str, callback: Callable[..., Any]) -> None:
        """Calls `callback(reply)` on "heartbeat" (HEARTBEAT_UPDATED),
        `callback(loss)` on "lost", `callback(result)` on "released"."""
        if event not in ("heartbeat", "lost", "released"):
            raise ValueError(f"no event {event!r}: heartbeat, lost or released")
        self._listeners.setdefault(event, []).append(callback)

    def _emit(self, event: str, value: Any) -> None:
        for cb in list(self._listeners.get(event, [])):
            try:
                cb(value)
            except Exception as e:  # a listener's failure is its own
                self._owner.log("warn", f"a {event} listener of {self.license}/{self.session} failed: {describe(e)}")

    def _target(self) -> SeatTarget:
        return SeatTarget(self.license, self.session, self.lease)

    async def _heartbeat_loop(self, first_pause: float) -> None:
        pause = first_pause
        while True:
            # Until the next beat is due; a heartbeat() in between restarts the count.
            while True:
                self._rescheduled.clear()
                due = max(pause, 0 if pause == 0 else MIN_PAUSE_MS)
                await _first_of(self._stop, self._rescheduled, due)
                if self._stop.is_set() or self._state != "held":
                    return
                if not self._rescheduled.is_set():
                    break
                pause = self._timeout_ms / 3
            next_pause = await self._beat()
            if next_pause is None:
                return
            pause = next_pause

    async def _beat(self) -> Optional[float]:
        """One heartbeat: the pause until the next, or None when the loop
        ends (stopped, lost)."""
        async with self._beat_lock:
            if self._stop.is_set() or self._state != "held":
                return None
            try:
                got = await self._owner.backend.heartbeat(self._target(), self._stop, None)
            except Exception as e:
                if self._stop.is_set():
                    return None
                # The client closed under it (or Redis failed beyond retrying).
                code = e.code if isinstance(e, SeatgateError) else "ERROR"
                self._lose(SeatLoss(code, describe(e), None))
                return None
            if got is None or self._stop.is_set():
                return None
            return self._heard(got.reply)

    def _heard(self, reply: Reply) -> Optional[float]:
        status = reply.get("status", "")
        if status == "HEARTBEAT_UPDATED":
            # A service that does not send the timeout on heartbeats leaves the grant's in force.
            self._timeout_ms = heartbeat_timeout_ms(reply, self._timeout_ms)
            self._heartbeats += 1
            self._last_beat_at = now_ms()
            if not self._first_beat.done():
                self._first_beat.set_result(None)
            self._emit("heartbeat", reply)
            return self._timeout_ms / 3
        if status in RETRY_LATER or status == "QUEUED":
            # Nothing decided about the seat: try again sooner.
            return self._timeout_ms / 6
        self._lose(SeatLoss(status, reply.get("error", ""), reply))
        return None

    async def heartbeat(self) -> Optional[Reply]:
        """Sends a heartbeat now, outside the schedule (which restarts from
        it), and returns its answer: HEARTBEAT_UPDATED, or the status that
        took the seat (then the seat is lost). None when the seat is no
        longer held or the heartbeat was stopped by a release."""
        async with self._beat_lock:
            if self._stop.is_set() or self._state != "held":
                return None
            got = await self._owner.backend.heartbeat(self._target(), self._stop, None)
            if got is None:
                return None
            self._heard(got.reply)
            self._rescheduled.set()
            return got.reply

    def _lose(self, loss: SeatLoss) -> None:
        if self._state != "held":
            return
        self._state = "lost"
        self._loss = loss
        self._owner.disown(self)
        self._owner.log("warn", f"lost the seat of {self.license}/{self.session}: {loss.status} {loss.error}".strip())
        if not self._first_beat.done():
            self._first_beat.set_result(loss)
        if not self._lost.done():
            self._lost.set_result(loss)
        self._emit("lost", loss)

    async def release(self) -> ReleaseResult:
        """Stops heartbeating and gives the seat back. Never reports a
        release that worked as failed: it keeps sending (the same id while an
        XADD's fate is unknown, then new ids, the same lease; a reply to any
        attempt counts) until the service answers, or until the seat's
        heartbeat timeout has run out since its last answered heartbeat (and
        at least the client's give_up_after_ms), through a Redis outage or
        freeze. Calling it again returns the same result."""
        return await self.release_by(None)

    def release_by(self, until_ms: Optional[float]) -> "asyncio.Future[ReleaseResult]":
        """The release, stopping at `until_ms` (now_ms() time) if that comes
        first (the client's close)."""
        if self._releasing is None:
            self._releasing = asyncio.ensure_future(self._do_release(until_ms))
        return self._releasing

    async def _do_release(self, until_ms: Optional[float]) -> ReleaseResult:
        self._stop.set()
        await asyncio.wait([self._task])
        t = self._owner.timing
        timeout = self._timeout_ms if self._state == "held" else 0.0
        deadline = max(self._last_beat_at + timeout + t.request_timeout_ms, now_ms() + t.give_up_after_ms)
        if until_ms is not None:
            deadline = min(deadline, until_ms)
        reply: Optional[Reply]
        try:
            reply = await self._owner.backend.release(self._target(), deadline)
        except Exception as e:
            self._owner.log("warn", f"release of {self.license}/{self.session}: {describe(e)}")
            reply = None
        self._owner.disown(self)
        if reply is None:
            result = ReleaseResult("unknown")
        elif reply.get("status", "") in GAVE_BACK:
            result = ReleaseResult("released", reply)
        else:
            result = ReleaseResult("already_gone", reply)
        if self._state == "held" and result.outcome != "unknown":
            self._state = "released"
        if not self._first_beat.done():
            self._first_beat.set_result(None)
        self._emit("released", result)
        return result

    async def __aenter__(self) -> "Seat":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._state == "held":
            await self.release()

    def __repr__(self) -> str:
        return f"<Seat {self.license}/{self.session} {self._state}>"


async def _first_of(a: asyncio.Event, b: asyncio.Event, ms: float) -> None:
    """Waits up to `ms` for either event."""
    if a.is_set() or b.is_set():
        return
    ta = asyncio.ensure_future(a.wait())
    tb = asyncio.ensure_future(b.wait())
    try:
        await asyncio.wait([ta, tb], timeout=max(0.0, ms) / 1000.0, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ta.cancel()
        tb.cancel()


async def acquire_seat(
    owner: SeatOwner,
    license: str,
    *,
    session: Optional[str] = None,
    user: Optional[str] = None,
    group: Optional[str] = None,
    priority: Optional[int] = None,
    borrow_ms: Optional[int] = None,
    wait_ms: Optional[int] = None,
    meta: Optional[Mapping[str, Any]] = None,
    lease: Optional[str] = None,
    on_queued: Optional[OnQueued] = None,
) -> Seat:
    """Takes a seat: see the module's doc. Cancelling it (the task, or
    asyncio.wait_for) gives the acquire up: the session is released in the
    background (a queued one leaves the queue)."""
    spec = check_spec(license, session, user, group, priority, borrow_ms, wait_ms, meta, lease)
    t = owner.timing
    attempt = owner.backend.start_acquire(spec)
    # Armed until the acquire ends in a seat or a plain refusal: any other
    # way out undoes it in the background.
    armed = True
    target = SeatTarget(license, spec.session, attempt.lease)
    try:
        got = await attempt.first(now_ms() + t.give_up_after_ms)
        if got is None:
            raise SeatgateError(ABORTED, f"acquire of {license}/{spec.session} was aborted")
        target = SeatTarget(license, spec.session, attempt.lease)
        if got.reply.get("status") == "QUEUED":
            got = await _wait_in_queue(owner, attempt, target, got.reply, spec.wait_ms, on_queued)
        reply = got.reply
        status = reply.get("status", "")
        if status not in GRANTS:
            # One attempt answered is the whole story; with more, an older one
            # might still be decided, so the undo stays armed to release it.
            if attempt.attempts <= 1:
                armed = False
            raise SeatgateError.refused(f"acquire of {license}/{spec.session}", reply)
        armed = False
        timeout = heartbeat_timeout_ms(reply, t.default_heartbeat_timeout_ms)
        # A GRANTED is claimed at once (the claim window); other grants
        # heartbeat a third of the timeout after their clock started.
        pause = (
            0.0
            if status == "GRANTED"
            else first_pause_ms(reply, timeout, got.written_ms, now_ms() - attempt.first_sent_at)
        )
        seat = Seat(owner, target, reply, timeout, pause)
        if status == "GRANTED":
            try:
                loss = await asyncio.shield(seat.first_heartbeat)
            except asyncio.CancelledError:
                owner.track(seat.release_by(None))
                raise
            if loss is not None and loss.reply is None:
                raise SeatgateError(loss.status, f"claim of the seat granted to {license}/{spec.session}: {loss.error}")
            if loss is not None:
                raise SeatgateError.refused(
                    f"claim of the seat granted to {license}/{spec.session}",
                    loss.reply if loss.reply is not None else {"status": loss.status, "error": loss.error},
                )
        return seat
    finally:
        if armed:
            owner.track(asyncio.ensure_future(_undo(owner, attempt, target)))
        else:
            attempt.close()


async def _wait_in_queue(
    owner: SeatOwner,
    attempt: AcquireAttempt,
    target: SeatTarget,
    queued: Reply,
    wait_ms: int,
    on_queued: Optional[OnQueued],
) -> Received:
    """After QUEUED: waits for the final reply under the acquire's id, up to
    its wait_ms plus the request timeout plus a margin, heartbeating every
    third of the heartbeat timeout so the place is kept (a service without
    waiter liveness answers SESSION_NOT_ACTIVE: no news)."""
    t = owner.timing

    def tell(r: Reply) -> None:
        position = int_field(r, "position")
        if position is not None and on_queued is not None:
            try:
                on_queued(position, r)
            except Exception as e:
                owner.log("warn", f"on_queued of {target.license}/{target.session} failed: {describe(e)}")

    tell(queued)
    timeout = heartbeat_timeout_ms(queued, t.default_heartbeat_timeout_ms)
    deadline = now_ms() + wait_ms + t.request_timeout_ms + QUEUE_MARGIN_MS
    next_beat = now_ms() + timeout / 3
    stop_beats = asyncio.Event()
    beating: Optional[asyncio.Task[None]] = None

    async def beat() -> None:
        nonlocal timeout
        try:
            got = await owner.backend.heartbeat(target, stop_beats, now_ms() + 2 * t.request_timeout_ms)
            if got is None:
                return
            if got.reply.get("status") == "QUEUED":
                timeout = heartbeat_timeout_ms(got.reply, timeout)
                tell(got.reply)
            # HEARTBEAT_UPDATED: the grant was claimed before its GRANTED was
            # read, which follows. SESSION_NOT_ACTIVE from a service without
            # waiter heartbeats: no news.
        except Exception as e:
            owner.log("debug", f"waiter heartbeat of {target.license}/{target.session}: {describe(e)}")

    try:
        while True:
            got = await attempt.next(min(deadline, next_beat))
            if got is None:
                if now_ms() >= deadline:
                    raise SeatgateError(
                        TIMEOUT,
                        f"no final answer to the queued acquire of {target.license}/{target.session} "
                        f"from {owner.backend.where} within its wait",
                    )
                if now_ms() >= next_beat:
                    next_beat = now_ms() + timeout / 3
                    if beating is None or beating.done():
                        beating = asyncio.ensure_future(beat())
                continue
            s = got.reply.get("status")
            if s == "QUEUED":
                tell(got.reply)
                continue
            if s == "REQUEST_EXPIRED":
                continue
            return got
    finally:
        stop_beats.set()


async def _undo(owner: SeatOwner, attempt: AcquireAttempt, target: SeatTarget) -> None:
    """Releases a session whose acquire was given up on (a queued one leaves
    the queue), then keeps listening to the acquire's attempts for a while
    and releases again after any grant that still comes."""
    t = owner.timing
    try:
        if not target.lease:
            return
        first = await owner.backend.release(target, now_ms() + t.give_up_after_ms)
        if first is None:
            owner.log("warn", f"no answer to the release of the given-up acquire of {target.license}/{target.session}")
        until = now_ms() + t.give_up_after_ms
        while True:
            late = await attempt.next(until)
            if late is None:
                return
            if late.reply.get("status", "") in GRANTS:
                owner.log("info", f"releasing {target.license}/{target.session}, granted after its acquire was given up on")
                await owner.backend.release(target, now_ms() + t.give_up_after_ms)
    except Exception as e:
        level = "debug" if isinstance(e, SeatgateError) and e.code == CLOSED else "warn"
        owner.log(level, f"could not undo the acquire of {target.license}/{target.session}: {describe(e)}")
    finally:
        attempt.close()


def check_spec(
    license: str,
    session: Optional[str],
    user: Optional[str],
    group: Optional[str],
    priority: Optional[int],
    borrow_ms: Optional[int],
    wait_ms: Optional[int],
    meta: Optional[Mapping[str, Any]],
    lease: Optional[str],
) -> AcquireSpec:
    def bad(what: str) -> SeatgateError:
        return SeatgateError(INVALID_ARGUMENT, what)

    if not isinstance(license, str) or not is_id(license):
        raise bad(f"license {license!r} is not {ID_RULE}")
    if session is None:
        session = f"py-{random_hex(8)}"
    if not isinstance(session, str) or not is_id(session):
        raise bad(f"session {session!r} is not {ID_RULE}")
    for name, v in (("user", user), ("group", group)):
        if v is not None and (not isinstance(v, str) or not is_id(v)):
            raise bad(f"{name} {v!r} is not {ID_RULE}")
    if lease is not None and (not isinstance(lease, str) or not is_lease(lease)):
        raise bad(LEASE_RULE)

    def whole(name: str, v: Optional[int], most: int) -> None:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > most):
            raise bad(f"{name} must be a whole number from 0 to {most}")

    whole("priority", priority, 9)
    whole("borrow_ms", borrow_ms, 31_536_000_000)
    whole("wait_ms", wait_ms, 86_400_000)
    if meta is not None and not isinstance(meta, Mapping):
        raise bad("meta must be a JSON object (a mapping)")
    return AcquireSpec(
        license=license,
        session=session,
        lease=lease,
        user=user,
        group=group,
        priority=priority,
        borrow_ms=borrow_ms,
        wait_ms=wait_ms or 0,
        meta=meta,
    )


__all__ = ["Seat", "SeatLoss", "ReleaseResult", "SeatState", "OnQueued", "acquire_seat"]
