"""Problem 2 of issue 37: `async with` the seatgate package's asyncio Client
after acquire_seat must always end. Enters and leaves a client N times in a
row, a seat held each time, and prints how long each exit (releasing the
seat, stopping the reader and writer, closing the connections) took.

Usage: exits.py <redis url> <examples dir> <license> <n>
"""

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(sys.argv[2], "..", "clients", "python", "src"))
import seatgate  # noqa: E402

URL, LICENSE, N = sys.argv[1], sys.argv[3], int(sys.argv[4])
DEADLINE_S = 2.0


async def one(i):
    client = await seatgate.Client.connect(URL, application="exits")
    await client.__aenter__()
    seat = await client.acquire_seat(LICENSE, f"exit-{i}")
    assert seat.state == "held"
    started = time.monotonic()
    await asyncio.wait_for(client.__aexit__(None, None, None), timeout=DEADLINE_S)
    assert seat.state == "released", seat
    return time.monotonic() - started


async def main():
    took = []
    for i in range(N):
        try:
            took.append(await one(i))
        except asyncio.TimeoutError:
            print(f"exit {i} did not end within {DEADLINE_S} s")
            return 1
    print(f"{N} exits: slowest {max(took):.3f} s, mean {sum(took) / N:.4f} s")
    return 0


sys.exit(asyncio.run(main()))
