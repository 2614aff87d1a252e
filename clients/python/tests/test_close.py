"""close() ends within 2 s while the reply reader is blocked in XREAD, 100
times in a row (redis-py's cancelled blocking XREAD can return an empty
result instead of raising: the loop checks its stop flag after every read),
and leaves no connection behind."""

from __future__ import annotations

import asyncio
import re
import time

from conftest import Service, run

from seatgate import Client


def clients(svc: Service) -> int:
    return int(svc.redis.con.info("clients")["connected_clients"])


def blocked_reads(svc: Service) -> int:
    return sum(1 for c in svc.redis.con.client_list() if re.fullmatch(r"xread", c.get("cmd", "")))


def test_close_100_times_in_a_row_each_within_2_s_while_xread_blocks(svc: Service) -> None:
    svc.license_put("close", "--seats", "5")
    baseline = clients(svc)

    async def main() -> None:
        slowest = 0.0
        total = 0.0
        for i in range(100):
            client = await Client.connect(svc.url)
            # Every tenth holds a seat, which close() releases.
            seat = await client.acquire_seat("close", session=f"c-{i}") if i % 10 == 0 else None
            for tries in range(400):
                if await asyncio.to_thread(blocked_reads, svc) >= 1:
                    break
                await asyncio.sleep(0.005)
            else:
                raise AssertionError("the reader never blocked")
            t0 = time.monotonic()
            await asyncio.wait_for(client.close(), 5)
            took = time.monotonic() - t0
            slowest = max(slowest, took)
            total += took
            assert took < 2.0, f"close {i} took {took:.3f} s"
            if seat is not None:
                assert seat.state == "released"
        print(f"100 closes: slowest {slowest * 1000:.1f} ms, mean {total * 10:.1f} ms")

    run(main())
    assert svc.status("close")["seats_used"] == 0
    for _ in range(100):
        if clients(svc) <= baseline:
            break
        time.sleep(0.02)
    assert clients(svc) <= baseline, f"{clients(svc) - baseline} connections left open"


def test_leaving_a_new_event_loop_right_after_close_ends(svc: Service) -> None:
    """asyncio.run() itself ends: no task of the client is left that would
    keep it waiting (100 runs, each < 2 s from close to the loop's end)."""
    svc.license_put("exits", "--seats", "2")
    slowest = 0.0
    for i in range(100):
        async def one() -> float:
            client = await Client.connect(svc.url, application="exits")
            seat = await client.acquire_seat("exits", session=f"exit-{i}")
            assert seat.state == "held"
            await asyncio.sleep(0.01)
            t0 = time.monotonic()
            await client.close()
            return t0

        t0 = run(one())
        took = time.monotonic() - t0
        slowest = max(slowest, took)
        assert took < 2.0, f"exit {i} took {took:.3f} s"
    print(f"100 exits: slowest {slowest:.3f} s")
    assert svc.status("exits")["seats_used"] == 0
