"""HTTP mode against a real `seatgate gateway` (plain HTTP on loopback, and
HTTPS with a private CA), with tokens from `seatgate token issue`: the same
seat handle acquires, heartbeats and releases, and a wait is granted over
server-sent events and claimed."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from typing import Iterator, List, Tuple

import pytest
from conftest import Gateway, Service, run

from seatgate import Client, SeatgateError

ENV = {"SEATGATE__STREAM__APPLICATIONS": "cad"}


@pytest.fixture(scope="module")
def gw() -> Iterator[Tuple[Service, Gateway]]:
    s = Service(ENV)
    g = Gateway(s.url, ENV)
    try:
        yield s, g
    finally:
        g.stop()
        s.stop()


def token(svc: Service, user: str) -> str:
    return svc.seatgate_ok("token", "issue", "--app", "cad", "--user", user, "--actor", "test").strip()


def test_acquire_heartbeat_and_release_through_the_gateway(gw: Tuple[Service, Gateway]) -> None:
    svc, g = gw
    svc.license_put("gw-life", "--seats", "1", "--heartbeat-timeout", "1500ms")
    ada = token(svc, "ada")

    async def main() -> None:
        async with Client.gateway(g.base_url, ada) as client:
            seat = await client.acquire_seat("gw-life", session="ws-1", meta={"host": "pc"})
            assert seat.grant["status"] == "ACQUIRED"
            assert seat.heartbeat_timeout_ms == 1500
            assert len(seat.lease) >= 16
            await asyncio.sleep(1.2)
            assert seat.heartbeats >= 1
            st = await asyncio.to_thread(svc.status, "gw-life")
            assert (st["holders"][0]["session"], st["holders"][0]["user"]) == ("cad/ws-1", "cad/ada")
            gone = await seat.release()
            assert gone.outcome == "released"
            assert gone.reply is not None and gone.reply["status"] == "RELEASED"

    run(main())
    assert [e["type"] for e in svc.events("gw-life")] == ["acquired", "released"]


def test_a_wait_through_the_gateway_is_granted_over_sse_and_claimed(gw: Tuple[Service, Gateway]) -> None:
    svc, g = gw
    svc.license_put("gw-wait", "--seats", "1")
    ada, bob = token(svc, "ada"), token(svc, "bob")

    async def main() -> None:
        async with Client.gateway(g.base_url, ada) as a, Client.gateway(g.base_url, bob) as b:
            held = await a.acquire_seat("gw-wait", session="a-1")
            positions: List[int] = []
            waiting = asyncio.ensure_future(
                b.acquire_seat("gw-wait", session="b-1", wait_ms=30000, on_queued=lambda p, r: positions.append(p)))
            await svc.await_event(lambda e: e["type"] == "queued" and e["session"] == "cad/b-1")
            await asyncio.sleep(0.3)  # the SSE stream is open
            assert positions[:1] == [1]
            t0 = time.monotonic()
            assert (await held.release()).outcome == "released"
            seat = await waiting
            assert seat.grant["status"] == "GRANTED"
            assert time.monotonic() - t0 < 3.0
            assert seat.heartbeats >= 1, "claimed with a heartbeat"
            assert seat.heartbeat_timeout_ms == 90000, "the claim heartbeat told the timeout"
            st = await asyncio.to_thread(svc.status, "gw-wait")
            assert st["holders"][0]["session"] == "cad/b-1"
            assert (await seat.release()).outcome == "released"

    run(main())


def test_a_refusal_through_the_gateway_carries_the_wire_status(gw: Tuple[Service, Gateway]) -> None:
    svc, g = gw
    svc.license_put("gw-full", "--seats", "1")
    ada, bob = token(svc, "ada"), token(svc, "bob")

    async def main() -> None:
        async with Client.gateway(g.base_url, ada) as a, Client.gateway(g.base_url, bob) as b:
            held = await a.acquire_seat("gw-full", session="a-2")
            with pytest.raises(SeatgateError) as e:
                await b.acquire_seat("gw-full", session="b-2")
            assert e.value.code == "NO_SEATS_AVAILABLE" and "\n" not in str(e.value)
            await held.release()
        async with Client.gateway(g.base_url, "sgt_nosuchtoken") as bad:
            with pytest.raises(SeatgateError) as e:
                await bad.acquire_seat("gw-full", session="c-1")
            assert e.value.code == "GATEWAY_UNAVAILABLE"
            assert "gateway" in str(e.value)

    run(main())


def test_over_https_with_a_private_ca(gw: Tuple[Service, Gateway]) -> None:
    svc, _ = gw
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test CA")
    d = tempfile.mkdtemp(prefix="seatgate-py-ca-")

    def f(name: str) -> str:
        return os.path.join(d, name)

    def ssl_(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ssl_("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f("ca.key"),
         "-out", f("ca.pem"), "-days", "1", "-subj", "/CN=seatgate python test CA")
    ssl_("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f("key.pem"),
         "-out", f("leaf.csr"), "-subj", "/CN=127.0.0.1")
    with open(f("ext.cnf"), "w") as fh:
        fh.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl_("x509", "-req", "-in", f("leaf.csr"), "-CA", f("ca.pem"), "-CAkey", f("ca.key"), "-CAcreateserial",
         "-out", f("cert.pem"), "-days", "1", "-extfile", f("ext.cnf"))
    tls = Gateway(svc.url, {**ENV, "SEATGATE__GATEWAY__TLS_CERT_FILE": f("cert.pem"),
                            "SEATGATE__GATEWAY__TLS_KEY_FILE": f("key.pem")}, "https")
    eve = token(svc, "eve")
    svc.license_put("gw-tls", "--seats", "1")

    async def main() -> None:
        async with Client.gateway(tls.base_url, eve, ca=f("ca.pem")) as client, \
                Client.gateway(tls.base_url, eve, give_up_after_ms=1000) as untrusting:
            seat = await client.acquire_seat("gw-tls", session="e-1")
            assert seat.grant["status"] == "ACQUIRED"
            assert (await seat.release()).outcome == "released"
            # Without the CA the certificate is not trusted: no seat, an error naming the gateway.
            with pytest.raises(SeatgateError) as e:
                await untrusting.acquire_seat("gw-tls", session="e-2")
            assert e.value.code == "TIMEOUT"
            assert "gateway" in str(e.value) and "certificate" in str(e.value).lower(), str(e.value)
            assert "\n" not in str(e.value)

    try:
        run(main())
    finally:
        tls.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_the_conformance_agent_in_http_mode(gw: Tuple[Service, Gateway]) -> None:
    from test_conformance import AgentProc

    svc, g = gw
    svc.license_put("gw-agent", "--seats", "1")
    a = AgentProc("--gateway", g.base_url, "--token", token(svc, "ada"))
    try:
        a.next(lambda o: o.get("event") == "ready")
        a.send({"cmd": "acquire", "name": "a", "license": "gw-agent", "session": "S-a"})
        assert a.next(lambda o: o.get("name") == "a") == {"name": "a", "event": "held", "status": "ACQUIRED",
                                                        "session": "S-a"}
        a.send({"cmd": "acquire", "name": "b", "license": "gw-agent", "session": "S-b", "wait_ms": 30000})
        assert a.next(lambda o: o.get("name") == "b") == {"name": "b", "event": "queued", "position": 1}
        a.send({"cmd": "release", "name": "a"})
        assert a.next(lambda o: o.get("name") == "a")["outcome"] == "released"
        assert a.next(lambda o: o.get("name") == "b")["status"] == "GRANTED"
        t0 = time.monotonic()
        a.send({"cmd": "exit"})
        a.next(lambda o: o.get("event") == "exited", 2.0)
        assert a.proc.wait(2) == 0
        assert time.monotonic() - t0 < 2.0
    finally:
        a.kill()
    assert svc.status("gw-agent")["seats_used"] == 0
