"""Test support: a real redis-server per test module on a free loopback port
with its own temp dir (no persistence), a `seatgate run` worker against it,
and the seatgate CLI. Every process is stopped by its PID when the module's
tests end. SEATGATE_BIN names the binary (default ../../target/debug/seatgate)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import pytest
import redis

PACKAGE_DIR = Path(__file__).resolve().parent.parent
REPO = PACKAGE_DIR.parent.parent
SEATGATE_BIN = os.environ.get("SEATGATE_BIN") or str(REPO / "target" / "debug" / "seatgate")

T = TypeVar("T")

# The admin trail's event types: a license's changes, not a seat's.
ADMIN_EVENTS = {"license_put", "license_deleted", "groups_changed"}


def run(coro: Any) -> Any:
    """Runs a coroutine to its end on a new event loop."""
    return asyncio.run(coro)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], seconds: float = 10.0) -> None:
    until = time.monotonic() + seconds
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if time.monotonic() > until:
            raise AssertionError(f"{what} did not come up within {seconds} s")
        time.sleep(0.05)


def base_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env.update({"RUST_LOG": "warn", "SEATGATE__STREAM__BLOCK_MS": "100", "SEATGATE__REAPER__SCHEDULE": "* * * * * *"})
    env.update(extra or {})
    return env


def _bin() -> str:
    if not os.path.exists(SEATGATE_BIN):
        raise AssertionError(f"no seatgate binary at {SEATGATE_BIN}: build it (cargo build) or set SEATGATE_BIN")
    return SEATGATE_BIN


class RedisServer:
    def __init__(self, extra: Sequence[str] = ()) -> None:
        self.dir = tempfile.mkdtemp(prefix="seatgate-py-redis-")
        for attempt in range(4):
            self.port = free_port()
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self.dir, "--logfile", os.path.join(self.dir, "redis.log"), *extra],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            self.url = f"redis://127.0.0.1:{self.port}"
            self.con = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=5)
            try:
                wait_for("redis-server", lambda: bool(self.con.ping()), 5.0)
                return
            except AssertionError:
                self.proc.kill()
                self.proc.wait()
                if attempt == 3:
                    raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill9(self) -> None:
        """SIGKILL, the files kept (stop() removes them)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        try:
            self.thaw()
        except ProcessLookupError:
            pass
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelDeployment:
    """A master, `replicas` replicas of it (--replicaof) and `sentinels`
    Sentinels (redis-server <conf> --sentinel) monitoring it as "seatgate"
    with a majority quorum, calling it down after 1 s: all on free loopback
    ports in temp dirs, killed by PID in stop()."""

    MASTER_NAME = "seatgate"

    def __init__(self, replicas: int = 1, sentinels: int = 3) -> None:
        self.nodes: List[RedisServer] = []
        self.sentinel_procs: List[Tuple[subprocess.Popen[bytes], int, str]] = []
        try:
            # No wait for more replicas before the first full sync.
            master = RedisServer(["--repl-diskless-sync-delay", "0"])
            self.nodes.append(master)
            for _ in range(replicas):
                self.nodes.append(RedisServer(["--replicaof", "127.0.0.1", str(master.port)]))
            quorum = sentinels // 2 + 1
            for _ in range(sentinels):
                self.sentinel_procs.append(self._spawn_sentinel(master.port, quorum))
            self._wait_known(replicas, sentinels)
        except BaseException:
            self.stop()
            raise

    def _spawn_sentinel(self, master_port: int, quorum: int) -> Tuple["subprocess.Popen[bytes]", int, str]:
        d = tempfile.mkdtemp(prefix="seatgate-py-sentinel-")
        port = free_port()
        name = self.MASTER_NAME
        conf = os.path.join(d, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {port}\nbind 127.0.0.1\nprotected-mode yes\ndir {d}\n"
                f"logfile {os.path.join(d, 'sentinel.log')}\n"
                f"sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n"
                f"sentinel down-after-milliseconds {name} 1000\n"
                f"sentinel failover-timeout {name} 10000\n"
                f"sentinel parallel-syncs {name} 1\n"
            )
        proc = subprocess.Popen(["redis-server", conf, "--sentinel"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return proc, port, d

    @property
    def addresses(self) -> List[Tuple[str, int]]:
        """The Sentinels' (host, port)."""
        return [("127.0.0.1", port) for _, port, _ in self.sentinel_procs]

    def env(self) -> Dict[str, str]:
        """The SEATGATE__* variables that put seatgate in Sentinel mode for this deployment."""
        return {
            "SEATGATE__REDIS__SENTINEL__URLS": ",".join(f"redis://{h}:{p}" for h, p in self.addresses),
            "SEATGATE__REDIS__SENTINEL__MASTER_NAME": self.MASTER_NAME,
        }

    def _sentinel(self, port: int) -> "redis.Redis[str]":
        return redis.Redis(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=1,
                           socket_connect_timeout=1)

    def named_by(self, port: int) -> Optional[int]:
        """The master's port as the Sentinel on `port` names it now."""
        try:
            with self._sentinel(port) as s:
                addr = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER_NAME)
        except redis.RedisError:
            return None
        return int(addr[1]) if addr else None

    def master_port(self) -> Optional[int]:
        for _, port, _ in self.sentinel_procs:
            named = self.named_by(port)
            if named is not None:
                return named
        return None

    def node(self, port: int) -> Optional[RedisServer]:
        return next((n for n in self.nodes if n.port == port), None)

    @staticmethod
    def role(node: RedisServer) -> Optional[str]:
        try:
            return str(node.con.execute_command("ROLE")[0])
        except redis.RedisError:
            return None

    def _wait_known(self, replicas: int, sentinels: int) -> None:
        def known() -> bool:
            for _, port, _ in self.sentinel_procs:
                with self._sentinel(port) as s:
                    m = s.execute_command("SENTINEL", "MASTER", self.MASTER_NAME)
                fields = dict(zip(m[::2], m[1::2])) if isinstance(m, list) else dict(m)
                if int(fields.get("num-slaves", 0)) < replicas:
                    return False
                if int(fields.get("num-other-sentinels", 0)) + 1 < sentinels:
                    return False
            return all(n.con.info("replication").get("master_link_status") == "up" for n in self.nodes[1:])

        wait_for("the Sentinels knowing the master, its replicas and each other", known, 20.0)

    def promoted(self, old: int, seconds: float = 30.0) -> int:
        """Waits until every Sentinel names a master other than `old` and
        that node says it is a master; returns its port."""
        found: List[int] = []

        def agreed() -> bool:
            named = [self.named_by(port) for _, port, _ in self.sentinel_procs]
            new = named[0]
            node = self.node(new) if new is not None else None
            if new is None or new == old or any(n != new for n in named) or node is None:
                return False
            if self.role(node) != "master":
                return False
            found[:] = [new]
            return True

        wait_for(f"a replica of :{old} promoted", agreed, seconds)
        return found[0]

    def stop(self) -> None:
        for proc, _, d in self.sentinel_procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            shutil.rmtree(d, ignore_errors=True)
        for n in self.nodes:
            n.stop()


class Worker:
    def __init__(self, url: str, env: Optional[Dict[str, str]] = None) -> None:
        port = free_port()
        self.proc = subprocess.Popen(
            [_bin(), "--redis", url, "run"],
            env=base_env({"SEATGATE__METRICS__LISTEN": f"127.0.0.1:{port}", **(env or {})}),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )
        self.metrics_port = port
        wait_for("seatgate run", self.ready, 20.0)

    def ready(self) -> bool:
        """Whether its /ready answers 200 now."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Gateway:
    """`seatgate gateway` on a loopback port (plain HTTP unless TLS files are in `env`)."""

    def __init__(self, url: str, env: Optional[Dict[str, str]] = None, scheme: str = "http") -> None:
        port = free_port()
        self.proc = subprocess.Popen(
            [_bin(), "--redis", url, "gateway"],
            env=base_env({"SEATGATE__GATEWAY__LISTEN": f"127.0.0.1:{port}", **(env or {})}),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )
        self.base_url = f"{scheme}://127.0.0.1:{port}"

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        wait_for("seatgate gateway", listening, 20.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Service:
    """A Redis and a worker."""

    def __init__(self, env: Optional[Dict[str, str]] = None) -> None:
        self.env = dict(env or {})
        self.redis = RedisServer()
        self.url = self.redis.url
        try:
            self.worker = Worker(self.url, self.env)
        except BaseException:
            self.redis.stop()
            raise

    def seatgate(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([_bin(), "--redis", self.url, *args], env=base_env(self.env), capture_output=True, text=True,
                              timeout=60)

    def seatgate_ok(self, *args: str) -> str:
        out = self.seatgate(*args)
        assert out.returncode == 0, f"seatgate {' '.join(args)} exited {out.returncode}: {out.stderr}{out.stdout}"
        return out.stdout

    def license_put(self, license: str, *args: str) -> None:
        self.seatgate_ok("license", "put", license, *args)

    def status(self, license: str) -> Dict[str, Any]:
        lic: Dict[str, Any] = json.loads(self.seatgate_ok("status", "--json", "--license", license))["licenses"][0]
        return lic

    def events(self, license: Optional[str] = None) -> List[Dict[str, str]]:
        """The seat events on seat:events (of `license`), the admin trail's
        (a license's creation, change or deletion) left out."""
        out = []
        for entry_id, fields in self.redis.con.xrange("seat:events", "-", "+"):
            if fields.get("type") in ADMIN_EVENTS:
                continue
            if license is None or fields.get("license") == license:
                out.append({"id": entry_id, **fields})
        return out

    def wait_for_event(self, pred: Callable[[Dict[str, str]], bool], seconds: float = 15.0) -> Dict[str, str]:
        found: List[Dict[str, str]] = []

        def check() -> bool:
            found[:] = [e for e in self.events() if pred(e)]
            return bool(found)

        wait_for("the event", check, seconds)
        return found[0]

    async def await_event(self, pred: Callable[[Dict[str, str]], bool], seconds: float = 15.0) -> Dict[str, str]:
        """wait_for_event, without blocking the event loop."""
        until = time.monotonic() + seconds
        while True:
            found = [e for e in await asyncio.to_thread(self.events) if pred(e)]
            if found:
                return found[0]
            assert time.monotonic() < until, "the event did not come"
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        self.worker.stop()
        self.redis.stop()


@pytest.fixture(scope="module")
def svc() -> Iterator[Service]:
    s = Service()
    try:
        yield s
    finally:
        s.stop()


def waiters_ready() -> bool:
    """Whether the server does waiter heartbeats and the claim window."""
    marker = os.environ.get("SEATGATE_WAITERS_READY") or os.path.join(os.path.dirname(SEATGATE_BIN), "WAITERS_READY")
    return os.path.exists(marker)


sys.path.insert(0, str(Path(__file__).resolve().parent))
