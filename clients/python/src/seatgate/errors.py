"""The one error type of the package: a code to match on and one line for people."""

from __future__ import annotations

import re
from typing import Optional

from .wire import Reply

#: Codes of failures that are not a refusal by the service.
REDIS_UNAVAILABLE = "REDIS_UNAVAILABLE"
GATEWAY_UNAVAILABLE = "GATEWAY_UNAVAILABLE"
TIMEOUT = "TIMEOUT"
ABORTED = "ABORTED"
CLOSED = "CLOSED"
INVALID_ARGUMENT = "INVALID_ARGUMENT"


def one_line(text: str) -> str:
    return re.sub(r"\s*[\r\n]+\s*", " ", text).strip()


class SeatgateError(Exception):
    """What went wrong, by `code`:

    - a wire status (``NO_SEATS_AVAILABLE``, ``QUEUE_TIMEOUT``,
      ``LIMIT_REACHED``, ``LICENSE_NOT_FOUND``, ``SESSION_NOT_ACTIVE``, ...)
      when the service refused: `reply` is its answer;
    - ``REDIS_UNAVAILABLE``: Redis could not be reached or failed;
    - ``GATEWAY_UNAVAILABLE``: the gateway could not be reached, or answered
      an HTTP error of its own;
    - ``TIMEOUT``: no answer in time (is a ``seatgate run`` worker serving?);
    - ``ABORTED``: the acquire was cancelled;
    - ``CLOSED``: the client was closed;
    - ``INVALID_ARGUMENT``: a value the service would refuse.

    The message is one line, and names Redis (or the gateway) when it failed.
    """

    def __init__(self, code: str, message: str, reply: Optional[Reply] = None) -> None:
        self.code = code
        self.message = one_line(message)
        self.reply = reply
        super().__init__(self.message)

    @classmethod
    def refused(cls, what: str, reply: Reply) -> "SeatgateError":
        """A refusal by the service: the reply's status is the code."""
        status = reply.get("status") or "UNKNOWN"
        error = reply.get("error") or ""
        return cls(status, f"{what} refused: {status}" + (f": {error}" if error else ""), reply)

    def __repr__(self) -> str:
        return f"SeatgateError({self.code!r}, {self.message!r})"


def describe(e: BaseException) -> str:
    """A short description of an exception (its message, else its type)."""
    text = one_line(str(e))
    return text or type(e).__name__
