"""Whether one more request fits a tenant's limits, from what its current windows hold: pure arithmetic, so the
store can ask it inside the one transaction that also records the admission (no check-then-act race between
processes).

Windows are fixed: the wall-clock minute and the UTC day, the same in every process on a host, so any number of
servers sharing one usage file count into the same rows. A fixed minute lets a burst straddle a boundary (at
most twice the limit over one sliding minute); in exchange, counting is one row per tenant per window, exact
under concurrency, and "Retry-After" is simply the time to the next window."""

import math
from dataclasses import dataclass

from ridgeline.tenancy.config import Limits

MINUTE = 60
DAY = 86_400


@dataclass(frozen=True)
class Windows:
    """What the tenant's current windows hold (admitted, not yet refunded)."""

    minute_requests: int = 0
    minute_tokens: int = 0
    day_tokens: int = 0


@dataclass(frozen=True)
class Rejection:
    reason: str  # requests_per_minute, tokens_per_minute, tokens_per_day
    message: str
    retry_after: int  # whole seconds: the next window that could admit it


def window_start(now: float, length: int) -> int:
    return int(now // length) * length


def check(limits: Limits, windows: Windows, tokens: int, now: float) -> Rejection | None:
    """None if a request reserving `tokens` fits every limit now; else the first limit it breaks."""
    to_next_minute = _seconds_to(now, MINUTE)
    if limits.requests_per_minute is not None and windows.minute_requests + 1 > limits.requests_per_minute:
        return Rejection("requests_per_minute", f"rate limit reached: {limits.requests_per_minute} requests per "
                         "minute", to_next_minute)
    if limits.tokens_per_minute is not None:
        if tokens > limits.tokens_per_minute:
            return Rejection("tokens_per_minute", f"request too large: it reserves {tokens} tokens (prompt + "
                             f"max_tokens), over the limit of {limits.tokens_per_minute} tokens per minute; lower "
                             "max_tokens", to_next_minute)
        if windows.minute_tokens + tokens > limits.tokens_per_minute:
            return Rejection("tokens_per_minute", f"rate limit reached: {limits.tokens_per_minute} tokens per minute "
                             f"({windows.minute_tokens} in use, this request reserves {tokens})", to_next_minute)
    if limits.tokens_per_day is not None and windows.day_tokens + tokens > limits.tokens_per_day:
        return Rejection("tokens_per_day", f"daily token budget reached: {limits.tokens_per_day} tokens per day "
                         f"({windows.day_tokens} used, this request reserves {tokens})", _seconds_to(now, DAY))
    return None


def _seconds_to(now: float, length: int) -> int:
    return max(1, math.ceil(window_start(now, length) + length - now))
