"""What a token costs on a machine paid by the hour: dollars per million prompt tokens and per million completion
tokens, for a workload as it spends the machine's time.

The machine is paid for every second of the span (a cloud rental bills idle hours; an owned machine depreciates
through them), so the span's cost is usd_per_hour x span. That cost is split between the two phases in proportion
to the machine time each took (prefill computing prompts, decode producing completions), idle time shared the same
way, and each phase's share is divided by the tokens it served. So a prompt token's price is set by prefill's
throughput, a completion token's by decode's (the batch it runs at included), and the blended price is the span's
cost over all its tokens: the same figure as the two prices weighted by the workload's mix.

Everything here is arithmetic over figures it is given (from `advise`'s napkin rates, a simulated run's steps, or
a server's recorded steps), so every caller prices the same way.
"""

from dataclasses import dataclass

MILLION = 1_000_000
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class PhaseWork:
    """What a machine did over a span: tokens served per phase and the machine seconds each phase took."""

    prompt_tokens: float
    completion_tokens: float
    prefill_s: float  # machine seconds spent prefilling (prompt chunks)
    decode_s: float  # machine seconds spent decoding (one row per completion token)
    span_s: float | None = None  # seconds paid for; None: the busy time alone (no idle)

    @property
    def busy_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def paid_s(self) -> float:
        return max(self.span_s if self.span_s is not None else 0.0, self.busy_s)


@dataclass(frozen=True)
class TokenCost:
    usd_per_hour: float
    prompt_usd_per_mtok: float | None  # None: no prompt tokens were served, so none has a price
    completion_usd_per_mtok: float | None
    blended_usd_per_mtok: float | None
    utilisation: float  # busy share of the paid span (idle time raises both prices by 1 / utilisation)

    def as_dict(self) -> dict:
        return {"usd_per_hour": self.usd_per_hour, "prompt_usd_per_mtok": self.prompt_usd_per_mtok,
                "completion_usd_per_mtok": self.completion_usd_per_mtok,
                "blended_usd_per_mtok": self.blended_usd_per_mtok, "utilisation": self.utilisation}


def token_cost(work: PhaseWork, usd_per_hour: float) -> TokenCost:
    """Dollars per million prompt, completion and all tokens of `work` on a machine costing `usd_per_hour`."""
    if usd_per_hour < 0:
        raise ValueError(f"usd_per_hour must be >= 0, got {usd_per_hour}")
    for name in ("prompt_tokens", "completion_tokens", "prefill_s", "decode_s"):
        if getattr(work, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(work, name)}")
    busy, paid = work.busy_s, work.paid_s
    span_usd = usd_per_hour * paid / SECONDS_PER_HOUR
    if busy <= 0:  # nothing ran: no token has a price
        return TokenCost(usd_per_hour, None, None, None, 0.0)
    # Idle time is charged to the phases in proportion to their busy time.
    prompt_usd, completion_usd = span_usd * work.prefill_s / busy, span_usd * work.decode_s / busy
    tokens = work.prompt_tokens + work.completion_tokens
    return TokenCost(
        usd_per_hour,
        prompt_usd / work.prompt_tokens * MILLION if work.prompt_tokens else None,
        completion_usd / work.completion_tokens * MILLION if work.completion_tokens else None,
        span_usd / tokens * MILLION if tokens else None,
        busy / paid,
    )


def work_at_rates(prompt_tokens: float, completion_tokens: float, prefill_tokens_per_s: float,
                  decode_tokens_per_s: float, span_s: float | None = None) -> PhaseWork:
    """The machine time a workload takes at these throughputs. `decode_tokens_per_s` is the machine's, all streams
    decoding together (per-stream speed x concurrency), not one stream's."""
    if prefill_tokens_per_s <= 0 or decode_tokens_per_s <= 0:
        raise ValueError("throughputs must be > 0")
    return PhaseWork(prompt_tokens, completion_tokens, prompt_tokens / prefill_tokens_per_s,
                     completion_tokens / decode_tokens_per_s, span_s)


def split_step(seconds: float, prompt_rows: int, decode_rows: int) -> tuple[float, float]:
    """A step's seconds as (prefill, decode): a step mixing prompt chunks and decode rows is shared between the
    phases by the rows each put through the weights (the matmuls over rows are most of a mixed step)."""
    rows = prompt_rows + decode_rows
    if rows <= 0:
        return 0.0, 0.0
    return seconds * prompt_rows / rows, seconds * decode_rows / rows


def usd_per_mtok(usd_per_hour: float, tokens_per_s: float) -> float:
    """One phase's price at one throughput, the machine busy with it all hour."""
    if tokens_per_s <= 0:
        raise ValueError("tokens_per_s must be > 0")
    return usd_per_hour / SECONDS_PER_HOUR / tokens_per_s * MILLION
