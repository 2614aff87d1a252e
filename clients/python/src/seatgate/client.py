"""The client: one per process (per event loop), in Redis mode
(``await Client.connect(url)``), with the seat handle of seat.py."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Set

from ._backend import Backend, Logger, Timing
from .errors import CLOSED, INVALID_ARGUMENT, SeatgateError, describe
from .seat import OnQueued, Seat, acquire_seat
from .wire import APP_RULE, DEFAULT_HEARTBEAT_TIMEOUT_MS, is_application, now_ms

if TYPE_CHECKING:
    from ._redis import SentinelAddress

_log = logging.getLogger("seatgate")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING}


def _python_logging(level: str, message: str) -> None:
    """The default logger: Python's logging, logger "seatgate"."""
    _log.log(_LEVELS.get(level, logging.WARNING), "%s", message)


def _timing(
    request_timeout_ms: float, ttl_ms: Optional[int], give_up_after_ms: float, default_heartbeat_timeout_ms: float
) -> Timing:
    return Timing(
        request_timeout_ms=request_timeout_ms,
        ttl_ms=int(max(1, min(ttl_ms if ttl_ms is not None else 5000, request_timeout_ms))),
        give_up_after_ms=give_up_after_ms,
        default_heartbeat_timeout_ms=default_heartbeat_timeout_ms,
    )


class Client:
    """A seatgate client: see the package README.

    ``async with await Client.connect(url) as client:`` closes it on the way out.
    """

    def __init__(self, backend: Backend, timing: Timing, log: Logger, close_timeout_ms: float) -> None:
        """Use Client.connect()."""
        self._backend = backend
        self._timing = timing
        self._log = log
        self._close_timeout_ms = close_timeout_ms
        self._seats: Set[Seat] = set()
        self._undoing: Set["asyncio.Future[Any]"] = set()
        # The acquires under way, which close() gives up first.
        self._acquiring: Set["asyncio.Future[Seat]"] = set()
        self._closing: Optional["asyncio.Future[None]"] = None

    # -- what the seats need of their owner (seat.SeatOwner) --
    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def timing(self) -> Timing:
        return self._timing

    @property
    def log(self) -> Logger:
        return self._log

    def adopt(self, seat: Seat) -> None:
        self._seats.add(seat)

    def disown(self, seat: Seat) -> None:
        self._seats.discard(seat)

    def track(self, task: "asyncio.Future[Any]") -> None:
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)

    # -- the API --
    @classmethod
    async def connect(
        cls,
        url: Optional[str] = None,
        application: Optional[str] = None,
        password: Optional[str] = None,
        *,
        sentinels: Optional[Sequence["SentinelAddress"]] = None,
        master_name: Optional[str] = None,
        sentinel_username: Optional[str] = None,
        sentinel_password: Optional[str] = None,
        username: Optional[str] = None,
        key_prefix: str = "seat",
        connect_timeout_ms: float = 5000,
        request_timeout_ms: float = 5000,
        ttl_ms: Optional[int] = None,
        give_up_after_ms: float = 30_000,
        default_heartbeat_timeout_ms: float = DEFAULT_HEARTBEAT_TIMEOUT_MS,
        close_timeout_ms: float = 1500,
        max_in_flight: int = 256,
        shards: Optional[int] = None,
        logger: Optional[Logger] = None,
    ) -> "Client":
        """Connects to Redis (Redis mode) and reads the service's topology
        from ``<key_prefix>:config`` (shards, the requests stream, which
        applications have a stream of their own, the replies prefix).

        - `url`: redis:// or rediss:// URL of the Redis the workers serve;
          or, instead of it,
        - `sentinels` and `master_name`: Redis Sentinel, the Sentinels as
          (host, port) pairs or "host:port" strings, and the name they
          monitor the master by (the service's redis.sentinel.urls and
          master_name). The client asks them for the master, and asks again
          when the master's connection drops or answers READONLY, so both
          its connections and every seat follow a failover.
          `sentinel_username` / `sentinel_password` log in to the Sentinels
          themselves (default password $SEATGATE_REDIS_SENTINEL_PASSWORD);
          `username` / `password` log in to the master as in URL mode.
        - `application`: its own requests stream when the service lists it
          in stream.applications; it names the reply stream (default "python").
        - `password`: default the URL's, else $SEATGATE_REDIS_PASSWORD.
        - `request_timeout_ms`: how long a reply is waited for before the
          request goes again under a new id; `ttl_ms` (at most that) the
          ttl_ms every request carries; `give_up_after_ms` how long an
          acquire goes on sending (a release goes on at least this long).
        - `close_timeout_ms`: how long close() lets the releases of the seats
          still held take before it drops the connections.
        - `max_in_flight`: most requests sent and not yet answered.
        - `shards`: the service's stream.shards, if not what seat:config says.
        - `logger`: ``logger(level, message)``; default Python's logging
          ("seatgate").

        Raises SeatgateError REDIS_UNAVAILABLE (naming Redis, or the
        Sentinels) when Redis cannot be reached, INVALID_ARGUMENT when
        neither or both of `url` and `sentinels` are given.
        """
        from ._redis import RedisOptions, RedisTransport, SentinelOptions, env_password, sentinel_addresses

        sentinel: Optional[SentinelOptions] = None
        if sentinels is not None:
            if url is not None:
                raise SeatgateError(INVALID_ARGUMENT, "give url or sentinels, not both")
            if not master_name:
                raise SeatgateError(INVALID_ARGUMENT, "sentinels needs master_name (the Sentinels' name of the master)")
            try:
                addresses = sentinel_addresses(sentinels)
            except ValueError as e:
                raise SeatgateError(INVALID_ARGUMENT, str(e)) from None
            sentinel = SentinelOptions(
                addresses=addresses,
                master_name=master_name,
                username=sentinel_username,
                password=sentinel_password
                if sentinel_password is not None
                else os.environ.get("SEATGATE_REDIS_SENTINEL_PASSWORD") or None,
            )
            url = ""
        elif url is None:
            raise SeatgateError(INVALID_ARGUMENT, "give url (redis://...) or sentinels and master_name")
        elif master_name is not None:
            raise SeatgateError(INVALID_ARGUMENT, "master_name is for sentinels; with url it is unused")
        if application is not None and not is_application(application):
            raise SeatgateError(INVALID_ARGUMENT, APP_RULE)
        if max_in_flight < 1:
            raise SeatgateError(INVALID_ARGUMENT, "max_in_flight must be at least 1")
        timing = _timing(request_timeout_ms, ttl_ms, give_up_after_ms, default_heartbeat_timeout_ms)
        log = logger or _python_logging
        backend = await RedisTransport.connect(
            RedisOptions(
                url=url,
                application=application,
                username=username,
                password=password if password is not None else env_password(url),
                key_prefix=key_prefix,
                connect_timeout_ms=connect_timeout_ms,
                max_in_flight=max_in_flight,
                shards=shards,
                timing=timing,
                log=log,
                sentinel=sentinel,
            )
        )
        return cls(backend, timing, log, close_timeout_ms)

    @classmethod
    def gateway(
        cls,
        base_url: str,
        token: str,
        ca: Optional[str] = None,
        *,
        request_timeout_ms: float = 5000,
        ttl_ms: Optional[int] = None,
        give_up_after_ms: float = 30_000,
        default_heartbeat_timeout_ms: float = DEFAULT_HEARTBEAT_TIMEOUT_MS,
        close_timeout_ms: float = 1500,
        logger: Optional[Logger] = None,
    ) -> "Client":
        """A client of ``seatgate gateway`` (HTTP mode): `base_url` like
        https://seats.example.com:8443 (http:// only on loopback), `token` a
        gateway token or an OpenID Connect access token, `ca` the PEM file
        of a private CA (a path, or the PEM text). Nothing is sent until the
        first acquire. Standard library only (asyncio streams and ssl)."""
        from ._gateway import GatewayTransport

        timing = _timing(request_timeout_ms, ttl_ms, give_up_after_ms, default_heartbeat_timeout_ms)
        log = logger or _python_logging
        return cls(GatewayTransport(base_url, token, ca, timing, log), timing, log, close_timeout_ms)

    @property
    def where(self) -> str:
        """Where the client talks to ("Redis at redis://...")."""
        return self._backend.where

    @property
    def reply_stream(self) -> Optional[str]:
        """In Redis mode, the stream replies come back on."""
        return getattr(self._backend, "reply_to", None)

    @property
    def stats(self) -> Dict[str, int]:
        """Redis mode's counters: pipelines, most_in_flight, unclaimed (replies without a waiter), read_retries."""
        return dict(getattr(self._backend, "stats", {}))

    @property
    def held_seats(self) -> List[Seat]:
        """The seats this client holds now."""
        return list(self._seats)

    async def acquire_seat(
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
        """Takes a seat of `license` and returns a handle that keeps it.

        - `session`: one per running copy of the product (default a new random one);
        - `user`, `group`: who the seat counts for (per-user and group policies);
        - `priority`: queue priority 0-9 (the license's max_priority caps it);
        - `borrow_ms`: borrow the seat this long (held without heartbeats);
        - `wait_ms`: wait in the queue this long when no seat is free (default: answer at once);
        - `meta`: display data kept with the session (a JSON object);
        - `lease`: the lease to bind the seat to (default a new random one);
        - `on_queued(position, reply)`: told the place in the queue at
          QUEUED, and each time a waiter heartbeat says it again.

        Raises SeatgateError whose code is the refusal's status
        (NO_SEATS_AVAILABLE, QUEUE_TIMEOUT, LICENSE_NOT_FOUND, ...), or
        TIMEOUT, CLOSED, INVALID_ARGUMENT, REDIS_UNAVAILABLE. Cancelling it
        gives the acquire up (the session is released in the background).
        """
        if self._closing is not None:
            raise SeatgateError(CLOSED, "the seatgate client is closed")
        task = asyncio.ensure_future(acquire_seat(
            self,
            license,
            session=session,
            user=user,
            group=group,
            priority=priority,
            borrow_ms=borrow_ms,
            wait_ms=wait_ms,
            meta=meta,
            lease=lease,
            on_queued=on_queued,
        ))
        self._acquiring.add(task)
        task.add_done_callback(self._acquiring.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and self._closing is not None:
                # Given up by close(), not by our caller.
                raise SeatgateError(
                    CLOSED, f"the seatgate client was closed while the acquire of {license} waited"
                ) from None
            task.cancel()
            raise

    async def close(self) -> None:
        """Gives up the acquires under way (a queued session leaves the
        queue), releases every seat still held (for at most
        close_timeout_ms), then drops the connections: it ends within about
        2 s even while a read is blocked. Calling it again waits for the
        same close."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._do_close())
        await asyncio.shield(self._closing)

    async def _do_close(self) -> None:
        until = now_ms() + self._close_timeout_ms
        # Acquires first, so that a seat released below is not granted to
        # one of our own waits: a cancelled acquire undoes itself (tracked
        # in _undoing, awaited below).
        acquiring = list(self._acquiring)
        for task in acquiring:
            task.cancel()
        if acquiring:
            await asyncio.wait(acquiring, timeout=max(0.0, until - now_ms()) / 1000.0)
            for task in acquiring:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved
        waits: List["asyncio.Future[Any]"] = [s.release_by(until) for s in list(self._seats)]
        waits.extend(self._undoing)
        if waits:
            await asyncio.wait(waits, timeout=max(0.0, until - now_ms()) / 1000.0)
        try:
            await self._backend.close()
        except Exception as e:
            self._log("warn", f"closing: {describe(e)}")
        for w in waits:
            if w.done() and not w.cancelled():
                w.exception()  # retrieved

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
