"""HTTP mode (seatgate gateway): not built yet."""

from __future__ import annotations

from typing import Optional

from ._backend import Logger, Timing
from .errors import INVALID_ARGUMENT, SeatgateError


class GatewayTransport:
    def __init__(self, base_url: str, token: str, ca: Optional[str], timing: Timing, log: Logger) -> None:
        raise SeatgateError(INVALID_ARGUMENT, "HTTP mode (Client.gateway) is not in this version of the package yet")
