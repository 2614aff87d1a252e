#!/usr/bin/env python3
"""The conformance agent (docs/testing.md, "The client conformance suite";
crates/seatgate-conformance drives it): the seatgate package's seat handle, driven
by JSON lines on stdin, answering JSON lines on stdout, one object per line,
flushed at once. Diagnostics go to stderr only.

    python3 conformance_agent.py --redis <url> [--application <app>]
    python3 conformance_agent.py --gateway <url> --token <bearer> [--ca <pem-file>]

The Redis password, if any, comes from SEATGATE_REDIS_PASSWORD. Commands:
{"cmd":"acquire","name":...,"license":...,"session"?,"user"?,"group"?,"priority"?,"borrow_ms"?,"wait_ms"?},
{"cmd":"release","name":...}, {"cmd":"exit"}; stdin closed is exit. It
imports the installed package, else the one in src/ beside it.
"""

import argparse
import asyncio
import json
import os
import sys
import threading

try:
    import seatgate
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
    import seatgate

EXIT_WITHIN_S = 1.8


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def diag(message):
    sys.stderr.write(f"conformance-agent: {message}\n")
    sys.stderr.flush()


def logger(level, message):
    if level != "debug":
        diag(f"{level}: {message}")


def optional_int(cmd, field):
    v = cmd.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{field} must be a whole number")
    return v


def optional_str(cmd, field):
    v = cmd.get(field)
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{field} must be a string")
    return v


class Agent:
    def __init__(self, client):
        self.client = client
        self.handles = {}  # name -> {"seat": Seat | None, "acquiring": Task}
        self.exiting = False

    def acquire(self, cmd):
        name, license = cmd.get("name"), cmd.get("license")
        if not isinstance(name, str) or not isinstance(license, str):
            raise ValueError('acquire needs "name" and "license"')
        entry = self.handles.get(name)
        if entry is not None and entry["seat"] is not None and entry["seat"].state == "held":
            raise ValueError(f"handle {name} already holds a seat")
        options = dict(
            session=optional_str(cmd, "session"),
            user=optional_str(cmd, "user"),
            group=optional_str(cmd, "group"),
            priority=optional_int(cmd, "priority"),
            borrow_ms=optional_int(cmd, "borrow_ms"),
            wait_ms=optional_int(cmd, "wait_ms"),
            on_queued=lambda position, reply: say({"name": name, "event": "queued", "position": position}),
        )
        entry = {"seat": None}
        self.handles[name] = entry

        async def run():
            try:
                seat = await self.client.acquire_seat(license, **options)
            except seatgate.SeatgateError as e:
                if e.reply is not None and e.reply.get("status") == e.code:
                    say({"name": name, "event": "refused", "status": e.code, "error": e.reply.get("error", "")})
                else:
                    say({"name": name, "event": "error", "error": str(e)})
                return
            except Exception as e:  # noqa: BLE001 - every failure is told
                say({"name": name, "event": "error", "error": f"{type(e).__name__}: {e}"})
                return
            entry["seat"] = seat
            say({"name": name, "event": "held", "status": seat.grant.get("status"), "session": seat.session})
            seat.on("lost", lambda loss: say({"name": name, "event": "lost", "status": loss.status,
                                               "reason": loss.error}))

        entry["acquiring"] = asyncio.ensure_future(run())

    def release(self, cmd):
        name = cmd.get("name")
        entry = self.handles.get(name)
        if entry is None:
            raise ValueError(f"no handle named {json.dumps(name)}")

        async def run():
            try:
                await entry["acquiring"]
                seat = entry["seat"]
                if seat is None:
                    say({"name": name, "event": "released", "outcome": "already_gone", "status": ""})
                    return
                result = await seat.release()
                status = result.reply.get("status", "") if result.reply is not None else ""
                say({"name": name, "event": "released", "outcome": result.outcome, "status": status})
            except Exception as e:  # noqa: BLE001
                say({"name": name, "event": "error", "error": str(e)})

        asyncio.ensure_future(run())

    async def exit(self):
        if self.exiting:
            return
        self.exiting = True
        try:
            await asyncio.wait_for(self.client.close(), EXIT_WITHIN_S)
        except Exception as e:  # noqa: BLE001 - out within 2 s, whatever happens
            diag(f"close: {e!r}")
        say({"event": "exited"})
        # Whatever is still running (an acquire in the queue) ends with the process.
        os._exit(0)

    def handle(self, line):
        if not line.strip():
            return
        try:
            cmd = json.loads(line)
            if not isinstance(cmd, dict):
                raise ValueError("a command is a JSON object")
        except ValueError as e:
            say({"event": "error", "error": f"bad JSON: {e}"})
            return
        try:
            what = cmd.get("cmd")
            if what == "acquire":
                self.acquire(cmd)
            elif what == "release":
                self.release(cmd)
            elif what == "exit":
                asyncio.ensure_future(self.exit())
            else:
                say({"event": "error", "error": f"unknown command {json.dumps(what)}"})
        except ValueError as e:
            out = {"name": cmd["name"]} if isinstance(cmd.get("name"), str) else {}
            say({**out, "event": "error", "error": str(e)})


def read_stdin(loop, lines):
    """Reads stdin in a thread of its own (a blocking read on any kind of
    stdin); None at its end."""
    for line in sys.stdin:
        loop.call_soon_threadsafe(lines.put_nowait, line)
    loop.call_soon_threadsafe(lines.put_nowait, None)


async def main(args):
    try:
        if args.redis:
            client = await seatgate.Client.connect(args.redis, application=args.application, logger=logger)
        else:
            client = seatgate.Client.gateway(args.gateway, args.token, ca=args.ca, logger=logger)
    except Exception as e:  # noqa: BLE001
        say({"event": "error", "error": str(e)})
        return 3
    agent = Agent(client)
    lines = asyncio.Queue()
    threading.Thread(target=read_stdin, args=(asyncio.get_running_loop(), lines), daemon=True).start()
    say({"event": "ready"})
    while True:
        line = await lines.get()
        if line is None:
            await agent.exit()
            return 0
        agent.handle(line)


def parse_args(argv):
    parser = argparse.ArgumentParser(description="seatgate's conformance agent for the Python package")
    parser.add_argument("--redis", help="redis:// URL (Redis mode)")
    parser.add_argument("--application")
    parser.add_argument("--gateway", help="gateway URL (HTTP mode)")
    parser.add_argument("--token")
    parser.add_argument("--ca")
    args = parser.parse_args(argv)
    if bool(args.redis) == bool(args.gateway):
        parser.error("give --redis <url> or --gateway <url> --token <bearer>")
    if args.gateway and not args.token:
        parser.error("--gateway needs --token")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
