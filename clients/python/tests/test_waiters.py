"""Waiter liveness and the claim window (issue 37, problem 4): a waiting
handle heartbeats every third of the heartbeat timeout and hears QUEUED; a
GRANTED is claimed at once with a heartbeat. Against a server that answers
the old way (a waiter's heartbeat gets SESSION_NOT_ACTIVE, and no
WAITERS_READY file beside the binary) the liveness test is skipped, saying
so; the claim test runs on both."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any, Dict, List

import pytest
from conftest import SEATGATE_BIN, Service, base_env, run, waiters_ready

from seatgate import Client


def license(svc: Service, name: str) -> None:
    svc.license_put(name, "--seats", "1", "--heartbeat-timeout", "3s")
    # The claim window, as a license field (a server without it ignores it).
    svc.redis.con.hset(f"seat:{{{name}}}:license", "claim_ms", "2000")


def waiter_heartbeat(svc: Service, lic: str, session: str, lease: str) -> Dict[str, Any]:
    """What a heartbeat of the waiting session answers (seatgate heartbeat
    with its lease). Its first line is the answer: the CLI may go on
    waiting after a QUEUED (for a final answer that never comes to a
    heartbeat), so it is stopped once it has said it."""
    proc = subprocess.Popen(
        [SEATGATE_BIN, "--redis", svc.url, "heartbeat", "--license", lic, "--session", session, "--lease", lease,
         "--json"],
        env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    reply: Dict[str, Any] = json.loads(line)
    return reply


def test_a_waiting_handle_keeps_its_place_with_heartbeats_answered_queued(svc: Service) -> None:
    license(svc, "live")
    skipped: List[str] = []

    async def main() -> None:
        # A QUEUED from a server without waiter liveness carries no
        # heartbeat_timeout_ms: assume the license's 3 s.
        async with await Client.connect(svc.url, default_heartbeat_timeout_ms=3000) as client:
            holder = await client.acquire_seat("live", session="holder")
            lease = "waiterlease0123456789abcdef"
            positions: List[int] = []
            waiting = asyncio.ensure_future(client.acquire_seat(
                "live", session="waiter", lease=lease, wait_ms=30000, on_queued=lambda p, r: positions.append(p)))
            await svc.await_event(lambda e: e["type"] == "queued" and e["session"] == "waiter")
            probe = await asyncio.to_thread(waiter_heartbeat, svc, "live", "waiter", lease)
            if probe["status"] == "SESSION_NOT_ACTIVE" and not waiters_ready():
                skipped.append("the server answers the old way (a waiter's heartbeat gets SESSION_NOT_ACTIVE, "
                               "no WAITERS_READY): waiter liveness not testable")
                await holder.release()
                await (await waiting).release()
                return
            assert probe["status"] == "QUEUED", probe
            assert probe["position"] == "1"
            assert probe["heartbeat_timeout_ms"] == "3000"
            # Past the heartbeat timeout, still waiting: the handle's heartbeats kept the place.
            await asyncio.sleep(4.5)
            assert len(positions) >= 3, positions
            assert all(p == 1 for p in positions)
            st = await asyncio.to_thread(svc.status, "live")
            assert [w["session"] for w in st["queue"]] == ["waiter"]
            assert not any(e["type"] == "queue_timeout" and e["session"] == "waiter" for e in svc.events("live"))
            await holder.release()
            seat = await waiting
            assert seat.grant["status"] == "GRANTED"
            await seat.release()

    run(main())
    if skipped:
        pytest.skip(skipped[0])


def test_a_granted_is_claimed_at_once(svc: Service) -> None:
    license(svc, "claim")

    async def main() -> None:
        async with await Client.connect(svc.url, default_heartbeat_timeout_ms=3000) as client:
            holder = await client.acquire_seat("claim", session="holder")
            waiting = asyncio.ensure_future(client.acquire_seat("claim", session="grantee", wait_ms=30000))
            await svc.await_event(lambda e: e["type"] == "queued" and e["session"] == "grantee")
            await asyncio.sleep(2.5)  # a few waiter heartbeats, whatever the server answers them
            await holder.release()
            seat = await waiting
            assert seat.grant["status"] == "GRANTED"
            assert seat.heartbeats >= 1, "claimed before acquire_seat returned"
            await asyncio.sleep(3.0)  # past claim_ms (2 s)
            assert seat.state == "held"
            evs = svc.events("claim")
            assert not any(e["type"] == "evicted" for e in evs), evs
            st = await asyncio.to_thread(svc.status, "claim")
            assert [h["session"] for h in st["holders"]] == ["grantee"]
            assert (await seat.release()).outcome == "released"

    run(main())
