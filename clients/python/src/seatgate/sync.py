"""The seat handle from synchronous code: ``seatgate.sync.Client`` runs the
asyncio client on an event loop in a background thread of its own, and
hands out ``Seat`` objects whose methods block until done.

    with seatgate.sync.Client.connect("redis://127.0.0.1:6379") as client:
        with client.acquire_seat("cad-pro", user="ada", wait_ms=60_000) as seat:
            ...  # the seat heartbeats by itself in the background thread

Callbacks (``on_queued``, ``seat.on(...)``) run in that background thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, TypeVar

from . import client as _client
from . import seat as _seat
from .seat import OnQueued, ReleaseResult, SeatLoss, SeatState
from .wire import Reply

T = TypeVar("T")


class _LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(started.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=main, name="seatgate-sync", daemon=True)
        self.thread.start()
        started.wait()

    def call(self, coro: Awaitable[T], timeout: Optional[float] = None) -> T:
        """Runs `coro` on the loop and waits for its result (an interrupt cancels it)."""
        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(_as_coro(coro), self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=0.5)

        try:
            self.call(drain(), timeout=1.0)
        except BaseException:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=1.0)
        if not self.thread.is_alive():
            self.loop.close()


async def _as_coro(aw: Awaitable[T]) -> T:
    return await aw


class Seat:
    """A seat held through a sync Client: the asyncio Seat's state, and
    blocking release() and heartbeat(). ``with seat:`` releases it."""

    def __init__(self, runner: _LoopThread, seat: _seat.Seat) -> None:
        self._runner = runner
        self._seat = seat

    @property
    def license(self) -> str:
        return self._seat.license

    @property
    def session(self) -> str:
        return self._seat.session

    @property
    def lease(self) -> str:
        return self._seat.lease

    @property
    def grant(self) -> Reply:
        return self._seat.grant

    @property
    def state(self) -> SeatState:
        return self._seat.state

    @property
    def heartbeats(self) -> int:
        return self._seat.heartbeats

    @property
    def heartbeat_timeout_ms(self) -> float:
        return self._seat.heartbeat_timeout_ms

    @property
    def loss(self) -> Optional[SeatLoss]:
        return self._seat.loss

    @property
    def lost_status(self) -> Optional[str]:
        return self._seat.lost_status

    @property
    def aio(self) -> _seat.Seat:
        """The asyncio Seat (use it on the client's loop thread only)."""
        return self._seat

    def on(self, event: str, callback: Callable[..., Any]) -> None:
        """As Seat.on; the callback runs in the client's background thread."""
        self._runner.loop.call_soon_threadsafe(self._seat.on, event, callback)

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[SeatLoss]:
        """Blocks until the service takes the seat (its loss), or `timeout`
        seconds pass (None)."""
        fut = asyncio.run_coroutine_threadsafe(_as_coro(asyncio.shield(self._seat.lost())), self._runner.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            return None

    def heartbeat(self) -> Optional[Reply]:
        """Sends a heartbeat now (see the asyncio Seat.heartbeat)."""
        return self._runner.call(self._seat.heartbeat())

    def release(self) -> ReleaseResult:
        """Gives the seat back, honestly (see the asyncio Seat.release)."""
        return self._runner.call(self._seat.release())

    def __enter__(self) -> "Seat":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._seat.state == "held":
            self.release()

    def __repr__(self) -> str:
        return f"<seatgate.sync.Seat {self.license}/{self.session} {self.state}>"


class Client:
    """The asyncio Client on a background thread; see seatgate.Client."""

    def __init__(self, runner: _LoopThread, client: _client.Client) -> None:
        """Use Client.connect()."""
        self._runner = runner
        self._client = client
        self._closed = False

    @classmethod
    def connect(cls, url: Optional[str] = None, application: Optional[str] = None, password: Optional[str] = None,
                **options: Any) -> "Client":
        """Connects as seatgate.Client.connect (the same options: a URL, or
        ``sentinels=[("10.0.0.1", 26379), ...], master_name="seatgate"``)."""
        runner = _LoopThread()
        try:
            c = runner.call(_client.Client.connect(url, application, password, **options))
        except BaseException:
            runner.stop()
            raise
        return cls(runner, c)

    @property
    def where(self) -> str:
        return self._client.where

    @property
    def reply_stream(self) -> Optional[str]:
        return self._client.reply_stream

    @property
    def stats(self) -> Dict[str, int]:
        return self._client.stats

    @property
    def aio(self) -> _client.Client:
        """The asyncio Client (use it on its loop thread only)."""
        return self._client

    def acquire_seat(
        self,
        license: str,
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
        """As seatgate.Client.acquire_seat; blocks until the seat is held
        (or raises SeatgateError). An interrupt (Ctrl-C) gives the acquire up."""
        s = self._runner.call(self._client.acquire_seat(
            license, session=session, user=user, group=group, priority=priority, borrow_ms=borrow_ms,
            wait_ms=wait_ms, meta=meta, lease=lease, on_queued=on_queued))
        return Seat(self._runner, s)

    def held_seats(self) -> List[Seat]:
        return [Seat(self._runner, s) for s in self._client.held_seats]

    def close(self) -> None:
        """Releases what is still held and stops the background thread
        (within about 2 s)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.call(self._client.close(), timeout=5.0)
        finally:
            self._runner.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
