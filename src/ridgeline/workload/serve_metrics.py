"""What one streamed request measured, and the serving figures a load level adds up to.

TTFT: send to first content chunk. ITL: gaps between content chunks. TPOT: (E2E - TTFT) / (output tokens - 1),
the per-token pace after the first. Goodput: completed requests per second that met every SLO given.
"""

from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    prompt: str
    ok: bool = False
    error: str = ""
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    chunk_times_s: list[float] = field(default_factory=list)  # arrival of each content chunk, from send
    chunks: int = 0
    usage_prompt_tokens: int | None = None  # from the server's final usage chunk
    usage_completion_tokens: int | None = None
    text: str = ""

    @property
    def output_tokens(self) -> int:
        """The server's count when it sends usage; otherwise one token per content chunk."""
        return self.usage_completion_tokens if self.usage_completion_tokens is not None else self.chunks

    @property
    def itls_s(self) -> list[float]:
        return list(np.diff(self.chunk_times_s)) if len(self.chunk_times_s) > 1 else []

    @property
    def tpot_s(self) -> float | None:
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    itl_ms: float | None = None  # applied to each request's mean inter-token latency (its TPOT)

    def met_by(self, result: RequestResult) -> bool:
        if self.ttft_ms is not None and result.ttft_s * 1e3 > self.ttft_ms:
            return False
        tpot = result.tpot_s
        return self.itl_ms is None or tpot is None or tpot * 1e3 <= self.itl_ms


def distribution_ms(values_s: list[float]) -> dict[str, float | None]:
    """mean and percentiles in milliseconds (None when there are no samples)."""
    if not values_s:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    values_ms = np.asarray(values_s) * 1e3
    return {"mean": float(values_ms.mean()), **{f"p{p}": float(np.percentile(values_ms, p)) for p in PERCENTILES}}


def summarise(results: list[RequestResult], duration_s: float, slo: Slo) -> dict:
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.usage_prompt_tokens or 0 for r in done)
    good = [r for r in done if slo.met_by(r)]
    return {
        "requests": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration_s,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "usage_reported": all(r.usage_completion_tokens is not None for r in done),
        "request_throughput": len(done) / duration_s,
        "output_tokens_per_s": output_tokens / duration_s,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / duration_s,
        "ttft_ms": distribution_ms([r.ttft_s for r in done]),
        "itl_ms": distribution_ms([itl for r in done for itl in r.itls_s]),
        "tpot_ms": distribution_ms([r.tpot_s for r in done if r.tpot_s is not None]),
        "e2e_ms": distribution_ms([r.e2e_s for r in done]),
        "slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms},
        "good_requests": len(good),
        "goodput": len(good) / duration_s,
    }
