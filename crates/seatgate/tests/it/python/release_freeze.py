"""Problem 3 of issue 37, in Python: five seats released while Redis is
frozen (SIGSTOP for 3 s, three times give_up_after_ms) are each reported
released once it goes on, never an error or SESSION_NOT_FOUND.

Usage: release_freeze.py <redis url> <examples dir> <license> <redis-server pid>
"""

import asyncio
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(sys.argv[2], "..", "clients", "python", "src"))
import seatgate  # noqa: E402

URL, LICENSE, PID = sys.argv[1], sys.argv[3], int(sys.argv[4])


async def main():
    async with await seatgate.Client.connect(URL, application="freeze", request_timeout_ms=500,
                                             give_up_after_ms=1000) as client:
        seats = [await client.acquire_seat(LICENSE, f"fz-{i}") for i in range(5)]
        os.kill(PID, signal.SIGSTOP)
        asyncio.get_running_loop().call_later(3.0, os.kill, PID, signal.SIGCONT)
        started = time.monotonic()
        results = await asyncio.gather(*(seat.release() for seat in seats), return_exceptions=True)
        took = time.monotonic() - started
        statuses = [f"{r.outcome} {r.reply.get('status') if r.reply else ''}".strip()
                    if isinstance(r, seatgate.ReleaseResult) else f"{type(r).__name__}: {r}" for r in results]
        print(f"released during a 3 s freeze: {statuses} after {took:.1f} s")
        return 0 if statuses == ["released RELEASED"] * 5 else 1


sys.exit(asyncio.run(main()))
