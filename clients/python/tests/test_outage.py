"""Honest release through a frozen Redis: redis-server is SIGSTOPped while
the release goes out, the handle keeps sending (the same id while an XADD's
fate is unknown, new ids after each request timeout, the same lease) and
reports what the service decided once it answers: released, and the events
stream shows it."""

from __future__ import annotations

import asyncio
import time
from typing import List

from conftest import Service, run

from seatgate import Client, SeatgateError
from seatgate.errors import REDIS_UNAVAILABLE


def test_a_release_sent_while_redis_is_frozen_for_4_s_reports_released(svc: Service) -> None:
    svc.license_put("frozen", "--seats", "1", "--heartbeat-timeout", "30s")
    logs: List[str] = []

    async def main() -> float:
        client = await Client.connect(svc.url, request_timeout_ms=1000, logger=lambda l, m: logs.append(f"{l} {m}"))
        try:
            seat = await client.acquire_seat("frozen", session="ice")
            svc.redis.freeze()
            t0 = time.monotonic()
            thawed = asyncio.get_running_loop().create_future()

            def thaw() -> None:
                svc.redis.thaw()
                thawed.set_result(time.monotonic())

            asyncio.get_running_loop().call_later(4.0, thaw)
            result = await seat.release()
            took = time.monotonic() - t0
            assert thawed.done(), "answered only after Redis came back"
            assert result.outcome == "released", result
            assert result.reply is not None and result.reply["status"] == "RELEASED"
            assert 3.9 <= took < 15, took
            return took
        finally:
            svc.redis.thaw()
            await client.close()

    took = run(main())
    evs = [f"{e['type']}:{e['session']}" for e in svc.events("frozen")]
    assert evs == ["acquired:ice", "released:ice"], evs
    assert svc.status("frozen")["seats_used"] == 0
    print(f"released after {took:.2f} s through a 4 s freeze")


def test_a_release_nobody_answers_before_the_heartbeat_timeout_ends_in_unknown(svc: Service) -> None:
    svc.license_put("gone", "--seats", "1", "--heartbeat-timeout", "1500ms")

    async def main() -> None:
        client = await Client.connect(svc.url, request_timeout_ms=500, give_up_after_ms=1000)
        try:
            seat = await client.acquire_seat("gone", session="far")
            svc.worker.stop()  # nobody decides anything any more
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            result = await seat.release()
            took = time.monotonic() - t0
            assert result.outcome == "unknown", result
            assert result.reply is None
            assert 0.9 <= took < 4, took
        finally:
            await client.close()

    run(main())


def test_an_acquire_while_redis_is_out_of_memory_says_so(svc: Service) -> None:
    """Redis full (maxmemory below used memory, noeviction) refuses every
    XADD with OOM: the acquire gives up with REDIS_UNAVAILABLE saying Redis
    is out of memory, and the log line of each refused send says it too."""
    svc.license_put("full", "--seats", "1")
    logs: List[str] = []

    async def main() -> None:
        client = await Client.connect(
            svc.url, request_timeout_ms=300, give_up_after_ms=1200, logger=lambda l, m: logs.append(f"{l} {m}")
        )
        try:
            svc.redis.con.setrange("ballast", 8 * 1024 * 1024, "x")
            svc.redis.con.config_set("maxmemory", "4mb")
            try:
                await client.acquire_seat("full", session="s1")
            except SeatgateError as e:
                assert e.code == REDIS_UNAVAILABLE, e
                assert "Redis is out of memory (OOM)" in e.message and "maxmemory" in e.message, e
            else:
                raise AssertionError("an acquire under OOM got a seat")
        finally:
            svc.redis.con.delete("ballast")
            svc.redis.con.config_set("maxmemory", "0")
            await client.close()

    run(main())
    assert any("Redis is out of memory (OOM)" in line for line in logs), logs
