"""seatgate's Python client: seat handles over Redis Streams.

- ``client``: ``await Client.connect(url)``, ``await client.acquire_seat(...)``, ``await client.close()``.
- ``seat``: the seat handle (heartbeats, waiting in the queue, lost, honest release).
- ``sync``: ``seatgate.sync.Client``, the same from synchronous code.
- ``wire``: statuses, replies, leases, shards (docs/protocol.md).
- ``errors``: SeatgateError.
"""

from .client import Client
from .errors import SeatgateError
from .seat import OnQueued, ReleaseResult, Seat, SeatLoss, SeatState
from .wire import Reply, crc32

__version__ = "0.1.0"

__all__ = [
    "Client",
    "OnQueued",
    "ReleaseResult",
    "Reply",
    "Seat",
    "SeatLoss",
    "SeatState",
    "SeatgateError",
    "crc32",
    "__version__",
]
