"""seatgate.sync: the seat handle from synchronous code (an event loop in a
background thread)."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest
from conftest import Service

import seatgate.sync
from seatgate import SeatgateError


def test_acquire_heartbeat_release_and_close(svc: Service) -> None:
    svc.license_put("sync", "--seats", "1", "--heartbeat-timeout", "1500ms")
    before = threading.active_count()
    with seatgate.sync.Client.connect(svc.url, application="synctest") as client:
        assert client.reply_stream is not None and client.reply_stream.startswith("seat:reply:synctest:")
        with client.acquire_seat("sync", session="s-1", user="ada", group="eng") as seat:
            assert seat.grant["status"] == "ACQUIRED"
            assert seat.state == "held"
            time.sleep(1.2)  # heartbeats in the background thread, every 500 ms
            assert seat.heartbeats >= 1
            beat = seat.heartbeat()
            assert beat is not None and beat["status"] == "HEARTBEAT_UPDATED"
            holder = svc.status("sync")["holders"][0]
            assert (holder["session"], holder["user"], holder["group"]) == ("s-1", "ada", "eng")
            with pytest.raises(SeatgateError) as e:
                client.acquire_seat("sync", session="s-2")
            assert e.value.code == "NO_SEATS_AVAILABLE"
        assert seat.state == "released"
        assert svc.status("sync")["seats_used"] == 0
        # close() releases what is still held.
        kept = client.acquire_seat("sync", session="s-3")
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2.0
    assert kept.state == "released"
    assert svc.status("sync")["seats_used"] == 0
    time.sleep(0.2)
    assert threading.active_count() <= before, "the background thread ended"


def test_queued_on_queued_and_lost(svc: Service) -> None:
    svc.license_put("sync2", "--seats", "1", "--heartbeat-timeout", "1500ms")
    with seatgate.sync.Client.connect(svc.url) as a, seatgate.sync.Client.connect(svc.url) as b:
        holder = a.acquire_seat("sync2", session="h")
        positions: List[int] = []
        threading.Timer(1.0, holder.release).start()
        seat = b.acquire_seat("sync2", session="w", wait_ms=20000, on_queued=lambda p, r: positions.append(p))
        assert seat.grant["status"] == "GRANTED"
        assert positions[:1] == [1]
        assert seat.wait_lost(0.1) is None
        svc.seatgate_ok("revoke", "--license", "sync2", "--session", "w", "--reason", "sync test")
        loss = seat.wait_lost(5)
        assert loss is not None and loss.status == "SESSION_REVOKED"
        assert seat.state == "lost"
        assert seat.release().outcome == "already_gone"


def test_unreachable_redis_raises_and_leaves_no_thread() -> None:
    from conftest import free_port

    before = threading.active_count()
    with pytest.raises(SeatgateError) as e:
        seatgate.sync.Client.connect(f"redis://127.0.0.1:{free_port()}", connect_timeout_ms=500)
    assert e.value.code == "REDIS_UNAVAILABLE"
    time.sleep(0.2)
    assert threading.active_count() <= before
