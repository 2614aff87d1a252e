"""Problem 5 of issue 37: the policy fields (group, priority, borrow) reach
the server from the seatgate package, through its asyncio Client and its
sync wrapper. Prints each reply as JSON.

Usage: policy_fields.py <redis url> <examples dir> <license>
"""

import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.join(sys.argv[2], "..", "clients", "python", "src"))
import seatgate  # noqa: E402
import seatgate.sync  # noqa: E402

URL, LICENSE = sys.argv[1], sys.argv[3]


async def from_asyncio():
    async with await seatgate.Client.connect(URL, application="policy") as client:
        # A borrowed seat for ada of group eng: the one seat.
        seat = await client.acquire_seat(LICENSE, "p-ada", user="ada", group="eng", borrow_ms=600_000)
        print("async borrow", json.dumps(dict(seat.grant)))
        # bob waits at priority 3 and gives up after half a second.
        try:
            await client.acquire_seat(LICENSE, "p-bob", user="bob", group="ops", priority=3, wait_ms=500,
                                      on_queued=lambda position, r: print("async queued", json.dumps(dict(r))))
            print("async wait", json.dumps({"status": "GRANTED"}))
        except seatgate.SeatgateError as e:
            print("async wait", json.dumps(dict(e.reply or {"status": e.code})))
        await seat.release()


asyncio.run(from_asyncio())
with seatgate.sync.Client.connect(URL, application="policy-sync") as sync:
    seat = sync.acquire_seat(LICENSE, "p-cy", user="cy", group="ops", priority=2, borrow_ms=60_000)
    print("sync borrow", json.dumps(dict(seat.grant)))
    seat.release()
