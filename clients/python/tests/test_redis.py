"""Redis mode against a real redis-server and `seatgate run`: a seat's life,
the wait queue, policy fields, a lost seat, and the errors people read."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, List

import pytest
from conftest import Service, free_port, run

import seatgate
from seatgate import Client, SeatgateError


def test_acquire_heartbeat_at_a_third_of_the_timeout_release(svc: Service) -> None:
    svc.license_put("life", "--seats", "2", "--heartbeat-timeout", "1500ms")

    async def main() -> None:
        async with await Client.connect(svc.url, application="pytest") as client:
            seat = await client.acquire_seat("life", session="ws-1", user="ada", meta={"host": "pc-1"})
            assert seat.grant["status"] == "ACQUIRED"
            assert seat.heartbeat_timeout_ms == 1500
            assert re.fullmatch(r"[0-9a-f]{32}", seat.lease)
            assert client.reply_stream is not None and client.reply_stream.startswith("seat:reply:pytest:")
            beats: List[str] = []
            seat.on("heartbeat", lambda r: beats.append(r["status"]))
            await asyncio.sleep(1.7)
            # every 500 ms: 3 in 1.7 s (the first 500 ms after the grant)
            assert 2 <= seat.heartbeats <= 4, seat.heartbeats
            assert beats and all(s == "HEARTBEAT_UPDATED" for s in beats)
            held = await asyncio.to_thread(svc.status, "life")
            assert held["seats_used"] == 1
            assert held["holders"][0]["session"] == "ws-1"
            assert held["holders"][0]["user"] == "ada"
            assert held["holders"][0]["heartbeats"] >= 2
            assert held["holders"][0]["leased"] is True
            gone = await seat.release()
            assert gone.outcome == "released"
            assert gone.reply is not None and gone.reply["status"] == "RELEASED"
            assert seat.state == "released"
            # A second release is the same answer, not a second request.
            assert (await seat.release()).outcome == "released"

    run(main())
    assert svc.status("life")["seats_used"] == 0
    assert [e["type"] for e in svc.events("life")] == ["acquired", "released"]


def test_queued_then_granted_when_the_holder_releases_and_claimed_at_once(svc: Service) -> None:
    svc.license_put("one", "--seats", "1")

    async def main() -> None:
        async with await Client.connect(svc.url) as client:
            holder = await client.acquire_seat("one", session="holder")
            positions: List[int] = []
            waiting = asyncio.ensure_future(
                client.acquire_seat("one", session="waiter", wait_ms=20000, on_queued=lambda p, r: positions.append(p))
            )
            await svc.await_event(lambda e: e["type"] == "queued" and e["session"] == "waiter")
            assert positions[:1] == [1]
            t0 = time.monotonic()
            assert (await holder.release()).outcome == "released"
            seat = await waiting
            assert seat.grant["status"] == "GRANTED"
            assert time.monotonic() - t0 < 2.0
            # Claimed: its first heartbeat went out at once and was answered.
            assert seat.heartbeats >= 1
            assert (await seat.release()).outcome == "released"

    run(main())
    evs = [f"{e['type']}:{e['session']}" for e in svc.events("one")]
    assert evs[:4] == ["acquired:holder", "queued:waiter", "released:holder", "granted:waiter"], evs


def test_a_refusal_is_a_seatgate_error_whose_code_is_the_status(svc: Service) -> None:
    svc.license_put("full", "--seats", "1")

    async def main() -> None:
        async with await Client.connect(svc.url) as client:
            holder = await client.acquire_seat("full", session="h")
            with pytest.raises(SeatgateError) as e:
                await client.acquire_seat("full", session="x")
            assert e.value.code == "NO_SEATS_AVAILABLE"
            assert e.value.reply is not None and e.value.reply["status"] == "NO_SEATS_AVAILABLE"
            assert re.match(r"^acquire of full/x refused: NO_SEATS_AVAILABLE: no free seat", str(e.value)), str(e.value)
            assert "\n" not in str(e.value)
            with pytest.raises(SeatgateError) as e:
                await client.acquire_seat("full", session="y", wait_ms=1000)
            assert e.value.code == "QUEUE_TIMEOUT"
            with pytest.raises(SeatgateError) as e:
                await client.acquire_seat("nosuch", session="z")
            assert e.value.code == "LICENSE_NOT_FOUND"
            with pytest.raises(SeatgateError) as e:
                await client.acquire_seat("full", session="bad id")
            assert e.value.code == "INVALID_ARGUMENT"
            with pytest.raises(SeatgateError) as e:
                await client.acquire_seat("full", lease="short")
            assert str(e.value) == "a lease is 16 to 128 characters of A-Z a-z 0-9 _ -"
            await holder.release()

    run(main())


def test_a_cancelled_wait_leaves_the_queue(svc: Service) -> None:
    svc.license_put("abort", "--seats", "1")

    async def main() -> None:
        async with await Client.connect(svc.url) as client:
            holder = await client.acquire_seat("abort", session="h")
            waiting = asyncio.ensure_future(client.acquire_seat("abort", session="w", wait_ms=30000))
            await svc.await_event(lambda e: e["type"] == "queued" and e["session"] == "w")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await svc.await_event(lambda e: e["type"] == "left_queue" and e["session"] == "w")
            await holder.release()

    run(main())
    assert svc.status("abort")["seats_used"] == 0


def test_policy_fields_reach_the_server(svc: Service) -> None:
    svc.license_put("pol", "--seats", "2", "--max-priority", "5", "--max-borrow", "1h", "--group-max", "eng=2")

    async def main() -> None:
        async with await Client.connect(svc.url) as client:
            borrowed = await client.acquire_seat("pol", session="b-1", user="ada", group="eng", borrow_ms=600000)
            assert borrowed.grant["status"] == "ACQUIRED"
            assert int(borrowed.grant["borrowed_until_ms"]) > time.time() * 1000 + 590000
            other = await client.acquire_seat("pol", session="b-2", user="bob", group="eng")
            positions: List[int] = []
            waiting = asyncio.ensure_future(client.acquire_seat(
                "pol", session="b-3", user="eve", priority=3, wait_ms=20000, on_queued=lambda p, r: positions.append(p)))
            queued = await svc.await_event(lambda e: e["type"] == "queued" and e["session"] == "b-3")
            assert queued["priority"] == "3"
            assert queued["user"] == "eve"
            st = await asyncio.to_thread(svc.status, "pol")
            ada = next(h for h in st["holders"] if h["session"] == "b-1")
            assert (ada["user"], ada["group"]) == ("ada", "eng")
            assert ada["borrowed_until_ms"] > time.time() * 1000
            assert st["seats_borrowed"] == 1
            assert st["queue"][0]["session"] == "b-3"
            assert st["queue"][0]["priority"] == 3
            acquired = next(e for e in svc.events("pol") if e["type"] == "acquired" and e["session"] == "b-1")
            assert (acquired["group"], acquired["user"]) == ("eng", "ada")
            assert acquired.get("borrowed_until_ms")
            await other.release()
            granted = await waiting
            assert granted.grant["status"] == "GRANTED"
            assert positions[:1] == [1]
            await granted.release()
            await borrowed.release()

    run(main())


def test_a_revoked_seat_is_lost(svc: Service) -> None:
    svc.license_put("rev", "--seats", "1", "--heartbeat-timeout", "1200ms")

    async def main() -> None:
        async with await Client.connect(svc.url) as client:
            seat = await client.acquire_seat("rev", session="laptop-42")
            heard: List[Any] = []
            seat.on("lost", heard.append)
            await asyncio.to_thread(svc.seatgate_ok, "revoke", "--license", "rev", "--session", "laptop-42",
                                    "--reason", "left the company", "--actor", "ada")
            loss = await asyncio.wait_for(seat.lost(), 5)
            assert loss.status == "SESSION_REVOKED"
            assert re.search(r"revoked by ada: left the company", loss.error), loss.error
            assert heard and heard[0].status == "SESSION_REVOKED"
            assert seat.state == "lost" and seat.lost_status == "SESSION_REVOKED"
            assert seat not in client.held_seats
            gone = await seat.release()
            assert gone.outcome == "already_gone"
            assert gone.reply is not None and gone.reply["status"] == "SESSION_REVOKED"

    run(main())


def test_redis_unreachable_is_redis_unavailable_in_one_line_naming_redis() -> None:
    port = free_port()
    t0 = time.monotonic()

    async def main() -> None:
        with pytest.raises(SeatgateError) as e:
            await Client.connect(f"redis://:secret@127.0.0.1:{port}", connect_timeout_ms=1000)
        assert e.value.code == "REDIS_UNAVAILABLE"
        assert re.match(rf"^cannot connect to Redis at redis://:\*\*\*@127.0.0.1:{port}", str(e.value)), str(e.value)
        assert "secret" not in str(e.value) and "\n" not in str(e.value)

    run(main())
    assert time.monotonic() - t0 < 3.0


def test_the_package_says_its_version() -> None:
    assert seatgate.__version__ == "0.1.0"
    assert seatgate.crc32("north") == __import__("zlib").crc32(b"north")


def test_closing_the_client_ends_a_wait_in_the_queue_with_closed(svc: Service) -> None:
    svc.license_put("shut", "--seats", "1")

    async def main() -> None:
        other = await Client.connect(svc.url)
        holder = await other.acquire_seat("shut", session="h")
        client = await Client.connect(svc.url)
        waiting = asyncio.ensure_future(client.acquire_seat("shut", session="w", wait_ms=30000))
        await svc.await_event(lambda e: e["type"] == "queued" and e["session"] == "w")
        t0 = time.monotonic()
        await client.close()
        with pytest.raises(SeatgateError) as e:
            await asyncio.wait_for(waiting, 2)
        assert e.value.code == "CLOSED"
        assert time.monotonic() - t0 < 2.0
        with pytest.raises(SeatgateError) as e:
            await client.acquire_seat("shut")
        assert e.value.code == "CLOSED"
        assert holder.state == "held"
        await other.close()
        assert holder.state == "released"

    run(main())
