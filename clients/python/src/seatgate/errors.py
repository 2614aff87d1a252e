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


#: What a Redis `OOM` refusal means, and what to do.
OUT_OF_MEMORY = "Redis is out of memory (OOM) and refuses writes: raise its maxmemory or free memory"


def is_out_of_memory(e: BaseException) -> bool:
    """Whether `e` is Redis's ``OOM`` refusal (used memory above maxmemory):
    redis-py 5 and later raise ``OutOfMemoryError`` without the code in the
    message, older ones a ``ResponseError`` starting with it."""
    return type(e).__name__ == "OutOfMemoryError" or str(e).startswith("OOM ")


def one_line(text: str) -> str:
    return re.sub(r"\s*[\r\n]+\s*", " ", text).strip()


class SeatgateError(Exception):
    """What went wrong, by `code`:

    - a wire status (``NO_SEATS_AVAILABLE``, ``QUEUE_TIMEOUT``,
      ``LIMIT_REACHED``, ``LICENSE_NOT_FOUND``, ``SESSION_NOT_ACTIVE``, ...)
      when the service refused: `reply` is its answer;
    - ``REDIS_UNAVAILABLE``: Redis could not be reached or failed (also
      when a request got no reply because Redis refused its sends with
      ``OOM``: the message says Redis is out of memory);
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
    """A short description of an exception (its message, else its type);
    Redis's ``OOM`` refusal says what it means."""
    text = one_line(str(e))
    if is_out_of_memory(e):
        return f"{OUT_OF_MEMORY} ({text})"
    return text or type(e).__name__
