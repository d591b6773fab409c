"""A replica's health as the router sees it: up, down (failed a check or a request; taken out until a check
passes again) or busy (it answered 429/503: left alone until its Retry-After has passed)."""

import time
from dataclasses import dataclass

DEFAULT_RETRY_AFTER_S = 1.0


@dataclass
class Health:
    up: bool = True
    busy_until: float = 0.0
    failures: int = 0
    last_error: str | None = None

    def usable(self, now: float | None = None) -> bool:
        return self.up and (now if now is not None else time.monotonic()) >= self.busy_until

    @property
    def state(self) -> str:
        if not self.up:
            return "down"
        return "busy" if time.monotonic() < self.busy_until else "up"

    def passed(self) -> bool:
        """A check or a request succeeded. Returns True if this brought the replica back."""
        rejoined = not self.up
        self.up, self.failures, self.last_error = True, 0, None
        return rejoined

    def failed(self, error: str) -> None:
        self.up, self.failures, self.last_error = False, self.failures + 1, error

    def busy(self, retry_after: float | None, now: float | None = None) -> None:
        now = now if now is not None else time.monotonic()
        self.busy_until = now + (retry_after if retry_after is not None else DEFAULT_RETRY_AFTER_S)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare from model servers; it falls back to the default)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
