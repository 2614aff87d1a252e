"""Redis Sentinel: the client finds the master through real Sentinels
(redis-server --sentinel), and a seat handle keeps its seat when the master
is killed -9 and a replica promoted; `seatgate run` is in Sentinel mode too
(SEATGATE__REDIS__SENTINEL__*), its --redis URL names no server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any, Dict, Iterator, List

import pytest
from conftest import SentinelDeployment, Worker, _bin, base_env, run, wait_for

import seatgate.sync
from seatgate import Client, SeatgateError

#: In Sentinel mode the URL is unused: it names no server at all.
NOWHERE = "redis://127.0.0.1:1"


class Deployment:
    """A Sentinel deployment (a master, one replica, three Sentinels) and a
    `seatgate run` worker in Sentinel mode."""

    def __init__(self) -> None:
        self.sentinel = SentinelDeployment(replicas=1, sentinels=3)
        self.env = self.sentinel.env()
        try:
            self.cli_ok("license", "put", "cad", "--seats", "3", "--heartbeat-timeout", "15s")
            self.worker = Worker(NOWHERE, self.env)
        except BaseException:
            self.sentinel.stop()
            raise

    def cli(self, *args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([_bin(), "--redis", NOWHERE, *args], env=base_env(self.env), capture_output=True,
                              text=True, timeout=60)

    def cli_ok(self, *args: str) -> str:
        out = self.cli(*args)
        assert out.returncode == 0, f"seatgate {' '.join(args)} exited {out.returncode}: {out.stderr}{out.stdout}"
        return out.stdout

    def holders(self, license: str) -> List[str]:
        """The sessions holding seats of `license`, as `seatgate status` reads them through the Sentinels."""
        lic: Dict[str, Any] = json.loads(self.cli_ok("status", "--json", "--license", license))["licenses"][0]
        return sorted(str(s["session"]) for s in lic.get("holders", []))

    def stop(self) -> None:
        self.worker.stop()
        self.sentinel.stop()


@pytest.fixture(scope="module")
def dep() -> Iterator[Deployment]:
    d = Deployment()
    try:
        yield d
    finally:
        d.stop()


def test_connect_needs_a_url_or_sentinels_with_a_master_name() -> None:
    async def main() -> None:
        for kwargs, says in [
            ({}, "url"),
            ({"sentinels": [("127.0.0.1", 26379)]}, "master_name"),
            ({"sentinels": [("127.0.0.1", 26379)], "master_name": "m", "url": "redis://x"}, "not both"),
            ({"sentinels": ["127.0.0.1"], "master_name": "m"}, "host:port"),
            ({"url": "redis://127.0.0.1:1", "master_name": "m"}, "master_name"),
        ]:
            with pytest.raises(SeatgateError) as e:
                await Client.connect(**kwargs)  # type: ignore[arg-type]
            assert e.value.code == "INVALID_ARGUMENT", e.value
            assert says in str(e.value), (kwargs, str(e.value))

    run(main())


def test_no_sentinel_answering_is_redis_unavailable_naming_the_sentinels() -> None:
    async def main() -> None:
        with pytest.raises(SeatgateError) as e:
            await Client.connect(sentinels=["127.0.0.1:1"], master_name="seatgate", connect_timeout_ms=1000)
        assert e.value.code == "REDIS_UNAVAILABLE", e.value
        assert "Sentinels at 127.0.0.1:1" in str(e.value), str(e.value)

    run(main())


def test_the_sync_client_connects_through_the_sentinels(dep: Deployment) -> None:
    with seatgate.sync.Client.connect(sentinels=dep.sentinel.addresses, master_name="seatgate",
                                      request_timeout_ms=2000) as client:
        assert "'seatgate' of the Sentinels at 127.0.0.1:" in client.where, client.where
        with client.acquire_seat("cad", session="sync-one") as seat:
            assert seat.grant["status"] == "ACQUIRED", seat.grant
            assert dep.holders("cad") == ["sync-one"]
        assert seat.state == "released"
    assert dep.holders("cad") == []


def test_a_seat_handle_keeps_its_seat_when_the_master_is_killed_and_a_replica_promoted(dep: Deployment) -> None:
    sentinel = dep.sentinel
    logs: List[str] = []

    async def main() -> str:
        client = await Client.connect(sentinels=sentinel.addresses, master_name="seatgate", request_timeout_ms=1000,
                                      give_up_after_ms=60_000, logger=lambda l, m: logs.append(f"{l} {m}"))
        try:
            seat = await client.acquire_seat("cad", session="before")
            assert seat.grant["status"] == "ACQUIRED", seat.grant
            assert seat.heartbeat_timeout_ms == 15_000
            beat = await seat.heartbeat()
            assert beat is not None and beat["status"] == "HEARTBEAT_UPDATED", beat

            victim = sentinel.master_port()
            assert victim is not None, "the Sentinels name a master"
            node = sentinel.node(victim)
            assert node is not None
            # The seat is on the replica before the kill (replication is
            # asynchronous: this test is about following the master, not
            # about writes the replica never got).
            assert int(node.con.execute_command("WAIT", 1, 5000)) >= 1, "the replica has the seat"
            assert await asyncio.to_thread(dep.holders, "cad") == ["before"]

            node.kill9()
            killed = time.monotonic()
            # An acquire sent while there is no master: sent again until the
            # promoted one's workers answer.
            during = asyncio.ensure_future(client.acquire_seat("cad", session="during"))
            promoted = await asyncio.to_thread(sentinel.promoted, victim, 30.0)
            took = time.monotonic() - killed
            beats_at_promotion = seat.heartbeats

            # A heartbeat now, and the handle's own schedule (every 5 s),
            # both answered on the new master.
            beat = await asyncio.wait_for(seat.heartbeat(), 30)
            assert beat is not None and beat["status"] == "HEARTBEAT_UPDATED", beat
            until = time.monotonic() + 20
            while seat.heartbeats < beats_at_promotion + 2:
                assert time.monotonic() < until, f"heartbeats stalled at {seat.heartbeats}: {logs}"
                await asyncio.sleep(0.1)
            assert seat.state == "held", seat.loss

            in_failover = await asyncio.wait_for(during, 30)
            assert in_failover.grant["status"] == "ACQUIRED", in_failover.grant

            # A new acquire and a release, through the same client.
            other = await client.acquire_seat("cad", session="after")
            assert other.grant["status"] == "ACQUIRED", other.grant
            assert await asyncio.to_thread(dep.holders, "cad") == ["after", "before", "during"]
            # The license's three seats are taken: a fourth session is refused.
            with pytest.raises(SeatgateError) as refused:
                await client.acquire_seat("cad", session="fourth")
            assert refused.value.code == "NO_SEATS_AVAILABLE", refused.value
            for s in (other, in_failover):
                released = await s.release()
                assert released.outcome == "released", released
            assert await asyncio.to_thread(dep.holders, "cad") == ["before"]

            # It is the promoted node that holds the seat, as a master.
            new = sentinel.node(promoted)
            assert new is not None and sentinel.role(new) == "master"
            kept = await seat.release()
            assert kept.outcome == "released", kept
            assert await asyncio.to_thread(dep.holders, "cad") == []
            return (f"master :{victim} killed, :{promoted} promoted after {took:.1f} s; "
                    f"{seat.heartbeats} heartbeats answered ({seat.heartbeats - beats_at_promotion} after the promotion)")
        finally:
            await client.close()

    print(run(main()))
    # The worker serves from the new master.
    wait_for("the worker ready on the new master", dep.worker.ready, 10.0)
