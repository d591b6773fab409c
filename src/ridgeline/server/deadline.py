"""A request's deadline: the header `x-ridgeline-deadline-ms: N` says "drop this request N milliseconds after it
reaches the server, wherever it is then" (queued, prefilling, in a KV transfer, decoding).

Relative, not a wall-clock time, so that no two machines' clocks need agree; each hop forwards what is left of it
(the front to its prefill and decode workers, the router to its replicas), so the whole path keeps one deadline.
OpenAI's API and vLLM have none; gRPC's `grpc-timeout` is the model. A request past its deadline gets 504
`deadline_exceeded` before its first byte, or that error as the stream's last event after it; its pages are freed.
"""

import time
from dataclasses import dataclass

from ridgeline.server.errors import APIError

DEADLINE_HEADER = "x-ridgeline-deadline-ms"


@dataclass(frozen=True)
class Deadline:
    at: float  # time.monotonic() when the request is dropped

    @classmethod
    def after_ms(cls, milliseconds: float) -> "Deadline":
        return cls(time.monotonic() + milliseconds / 1000)

    def remaining(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.at - time.monotonic())

    def header(self) -> dict[str, str]:
        """The header that hands what is left of it to the next hop."""
        return {DEADLINE_HEADER: str(max(1, int(self.remaining() * 1000)))}


def request_deadline(headers) -> Deadline | None:
    """The deadline a request's headers carry, None if none; a 400 naming the header if it is not a positive
    number of milliseconds."""
    value = headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    try:
        milliseconds = float(value)
    except ValueError:
        milliseconds = float("nan")
    if not milliseconds > 0 or milliseconds == float("inf"):
        raise APIError(400, f"header {DEADLINE_HEADER} must be a positive number of milliseconds, got {value!r}",
                       DEADLINE_HEADER, "invalid_deadline")
    return Deadline.after_ms(milliseconds)


def deadline_error() -> APIError:
    return APIError(504, "the request's deadline passed before it finished; it was dropped",
                    code="deadline_exceeded")


def forwarded(deadline: Deadline | None) -> dict[str, str] | None:
    return deadline.header() if deadline is not None else None
