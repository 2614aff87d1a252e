"""A self-check of conformance_agent.py: the JSON-lines contract the
repository's conformance harness drives, against a real worker."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from conftest import PACKAGE_DIR, Service

Line = Dict[str, Any]


class AgentProc:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PACKAGE_DIR / "conformance_agent.py"), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
        )
        self.lines: "queue.Queue[Optional[Line]]" = queue.Queue()
        self.seen: List[Line] = []
        self.stderr = ""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))  # every line is one JSON object
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def next(self, pred: Callable[[Line], bool], seconds: float = 15.0) -> Line:
        for i, o in enumerate(self.seen):
            if pred(o):
                return self.seen.pop(i)
        until = time.monotonic() + seconds
        while True:
            left = until - time.monotonic()
            try:
                o = self.lines.get(timeout=max(0.0, left))
            except queue.Empty:
                raise AssertionError(f"no matching line within {seconds} s; saw {self.seen}; stderr {self.stderr}")
            if o is None:
                raise AssertionError(f"the agent ended; saw {self.seen}; stderr {self.stderr}")
            if pred(o):
                return o
            self.seen.append(o)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        time.sleep(0.05)  # the readers see the end
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except (OSError, ValueError):
                    pass


def test_the_agent_ready_held_queued_refused_released_lost_errors_exited(svc: Service) -> None:
    svc.license_put("conf", "--seats", "1", "--heartbeat-timeout", "1500ms")
    a = AgentProc("--redis", svc.url, "--application", "conf")
    try:
        a.next(lambda o: o.get("event") == "ready")
        a.send({"cmd": "acquire", "name": "a", "license": "conf", "session": "S-a", "user": "ada"})
        assert a.next(lambda o: o.get("name") == "a") == {"name": "a", "event": "held", "status": "ACQUIRED",
                                                        "session": "S-a"}
        a.send({"cmd": "acquire", "name": "r", "license": "conf", "session": "S-r"})
        refused = a.next(lambda o: o.get("name") == "r")
        assert refused["event"] == "refused" and refused["status"] == "NO_SEATS_AVAILABLE" and refused["error"]
        a.send({"cmd": "acquire", "name": "b", "license": "conf", "session": "S-b", "wait_ms": 60000})
        assert a.next(lambda o: o.get("name") == "b") == {"name": "b", "event": "queued", "position": 1}
        a.send("{not json")
        assert a.next(lambda o: o.get("event") == "error" and "name" not in o)["error"].startswith("bad JSON")
        a.send({"cmd": "dance"})
        assert re.search("unknown command", a.next(lambda o: o.get("event") == "error" and "name" not in o)["error"])
        a.send({"cmd": "release", "name": "a"})
        assert a.next(lambda o: o.get("name") == "a") == {"name": "a", "event": "released", "outcome": "released",
                                                        "status": "RELEASED"}
        held = a.next(lambda o: o.get("name") == "b" and o.get("event") != "queued")
        assert held == {"name": "b", "event": "held", "status": "GRANTED", "session": "S-b"}
        svc.seatgate_ok("revoke", "--license", "conf", "--session", "S-b", "--reason", "conformance")
        lost = a.next(lambda o: o.get("name") == "b" and o.get("event") != "queued")
        assert lost["event"] == "lost" and lost["status"] == "SESSION_REVOKED"
        assert re.search("conformance", lost["reason"])
        a.send({"cmd": "acquire", "name": "c", "license": "conf", "session": "S-c"})
        assert a.next(lambda o: o.get("name") == "c")["event"] == "held"
        t0 = time.monotonic()
        a.send({"cmd": "exit"})
        a.next(lambda o: o.get("event") == "exited", 2.0)
        assert a.proc.wait(2) == 0
        assert time.monotonic() - t0 < 2.0
    finally:
        a.kill()
    # exit released what it held.
    assert svc.status("conf")["seats_used"] == 0


def test_the_agent_stdin_closed_behaves_as_exit(svc: Service) -> None:
    svc.license_put("conf2", "--seats", "1")
    a = AgentProc("--redis", svc.url)
    try:
        a.next(lambda o: o.get("event") == "ready")
        a.send({"cmd": "acquire", "name": "x", "license": "conf2"})
        held = a.next(lambda o: o.get("name") == "x")
        assert held["event"] == "held"
        assert re.fullmatch(r"py-[0-9a-f]{16}", held["session"]), held
        t0 = time.monotonic()
        assert a.proc.stdin is not None
        a.proc.stdin.close()
        a.next(lambda o: o.get("event") == "exited", 2.0)
        assert a.proc.wait(2) == 0
        assert time.monotonic() - t0 < 2.0
    finally:
        a.kill()
    assert svc.status("conf2")["seats_used"] == 0


def test_the_agent_exits_within_2_s_while_a_seat_waits_in_the_queue(svc: Service) -> None:
    svc.license_put("conf3", "--seats", "1")
    a = AgentProc("--redis", svc.url)
    try:
        a.next(lambda o: o.get("event") == "ready")
        a.send({"cmd": "acquire", "name": "h", "license": "conf3"})
        assert a.next(lambda o: o.get("name") == "h")["event"] == "held"
        a.send({"cmd": "acquire", "name": "w", "license": "conf3", "wait_ms": 60000})
        assert a.next(lambda o: o.get("name") == "w")["event"] == "queued"
        t0 = time.monotonic()
        a.send({"cmd": "exit"})
        a.next(lambda o: o.get("event") == "exited", 2.0)
        assert a.proc.wait(2) == 0
        assert time.monotonic() - t0 < 2.0
    finally:
        a.kill()
