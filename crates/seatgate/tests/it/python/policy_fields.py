"""Problem 5 of issue 37: the policy fields (group, priority, borrow)
reach the server from both Python clients. Prints each reply as JSON.

Usage: policy_fields.py <redis url> <examples dir> <license>
"""

import asyncio
import json
import sys

sys.path.insert(0, sys.argv[2])
import python_async_client as pac  # noqa: E402
import python_client as pc  # noqa: E402
import redis  # noqa: E402

URL, LICENSE = sys.argv[1], sys.argv[3]


async def from_asyncio():
    async with pac.SeatClient(URL, app="policy") as client:
        # A borrowed seat for ada of group eng: the one seat.
        seat = await client.acquire_seat(LICENSE, "p-ada", user="ada", group="eng", borrow_s=600)
        print("async borrow", json.dumps(seat.grant))
        # bob waits at priority 3 and gives up after half a second.
        reply = await client.acquire(LICENSE, "p-bob", user="bob", group="ops", priority=3, wait_s=0.5,
                                     on_queued=lambda r: print("async queued", json.dumps(r)))
        print("async wait", json.dumps(reply))
        await seat.release()


asyncio.run(from_asyncio())
sync = pc.SeatClient(redis.Redis.from_url(URL, decode_responses=True), app="policy-sync")
reply = sync.acquire(LICENSE, "p-cy", user="cy", group="ops", priority=2, borrow_s=60)
print("sync borrow", json.dumps(reply))
sync.release(LICENSE, "p-cy")
sync.close()
