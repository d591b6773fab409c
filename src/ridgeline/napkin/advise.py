"""Rank machines for a workload (prompt length, output length, concurrency) with the source documents' two rules.

Decode: tokens/s is bandwidth / bytes read per token, discounted to 50%. Prefill: a long prompt is one big
matmul, so time to first token is FLOPs / compute, discounted the same way. Which of the two takes longer
per request says whether the workload is prefill-bound or decode-bound on that machine.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from ridgeline.errors import RidgelineError
from ridgeline.napkin.hardware import Hardware
from ridgeline.napkin.model_shape import ModelShape
from ridgeline.napkin.roofline import Roofline
from ridgeline.napkin.token_cost import TokenCost, token_cost, work_at_rates

EFFICIENCY = 0.5  # "discount to 50%": the realistic share of a ceiling an engine reaches

RULES = (
    "Decode: every output token streams the weights it uses (and its KV cache) through memory, so tokens/s "
    "is about memory bandwidth / bytes read per token, roughly bandwidth / quantised file size. Engines reach "
    f"about half of that, so the estimate takes {EFFICIENCY:.0%}.",
    "Prefill: the prompt goes through as one big matrix multiply (2 x active parameters FLOPs per token), so "
    "time to first token is set by compute, not bandwidth. For long prompts and short answers (coding agents, "
    f"document QA, RAG) you are buying compute. The estimate takes {EFFICIENCY:.0%} of peak FLOP/s here too.",
)


@dataclass(frozen=True)
class RequestShape:
    prompt_tokens: int
    output_tokens: int
    concurrency: int = 1


@dataclass(frozen=True)
class Slo:
    """A latency target a machine must meet: time to first token and inter-token latency (None: no target)."""

    ttft_s: float | None = None
    itl_s: float | None = None

    def met_by(self, ttft_s: float, itl_s: float) -> bool:
        return (self.ttft_s is None or ttft_s <= self.ttft_s) and (self.itl_s is None or itl_s <= self.itl_s)


@dataclass(frozen=True)
class Advice:
    hardware: Hardware
    fits: bool
    why_not: str  # empty when it fits
    ttft_s: float
    tokens_per_s_per_stream: float
    tokens_per_s_total: float
    request_s: float
    bound_by: str  # "prefill" or "decode": the phase that takes longer per request
    prefill_side: str  # "compute" or "memory": which side of the ridge prefill sits on
    decode_side: str
    concurrency: int = 1
    cost: TokenCost | None = None  # None: the machine has no price and none was given
    meets_slo: bool = True

    @property
    def itl_s(self) -> float:
        return 1 / self.tokens_per_s_per_stream


def workload_cost(workload: RequestShape, ttft_s: float, tokens_per_s_total: float, usd_per_hour: float) -> TokenCost:
    """$/Mtok of a workload on a machine kept busy with it: each request's prompt prefilled alone (its TTFT) and
    its output decoded alongside `concurrency - 1` others at the machine's total decode rate."""
    return token_cost(work_at_rates(workload.prompt_tokens, workload.output_tokens, workload.prompt_tokens / ttft_s,
                                    tokens_per_s_total), usd_per_hour)


def advise_one(shape: ModelShape, hardware: Hardware, workload: RequestShape, budget_bytes: float | None = None,
               usd_per_hour: float | None = None, slo: Slo | None = None) -> Advice:
    roofline = Roofline(shape, hardware)
    usable = min(hardware.memory_bytes, budget_bytes) if budget_bytes else hardware.memory_bytes
    total_tokens = workload.prompt_tokens + workload.output_tokens
    kv_bytes = workload.concurrency * shape.kv_bytes_for_context(total_tokens)
    why_not = ""
    if shape.total_weight_bytes > usable:
        why_not = f"weights need {shape.total_weight_bytes / 1e9:,.1f} GB, {usable / 1e9:,.0f} GB usable"
    elif shape.total_weight_bytes + kv_bytes > usable:
        why_not = f"weights + KV for {workload.concurrency} x {total_tokens:,} tokens need {(shape.total_weight_bytes + kv_bytes) / 1e9:,.1f} GB, {usable / 1e9:,.0f} GB usable"

    prefill = roofline.prefill(workload.prompt_tokens)
    # Decode runs all streams together, each halfway through its answer on average.
    decode = roofline.decode(workload.concurrency, workload.prompt_tokens + workload.output_tokens // 2)
    ttft = prefill.seconds / EFFICIENCY
    per_stream = EFFICIENCY / decode.seconds
    decode_s = workload.output_tokens / per_stream
    price = usd_per_hour if usd_per_hour is not None else hardware.price.usd_per_hour if hardware.price else None
    return Advice(
        hardware=hardware,
        fits=not why_not,
        why_not=why_not,
        ttft_s=ttft,
        tokens_per_s_per_stream=per_stream,
        tokens_per_s_total=per_stream * workload.concurrency,
        request_s=ttft + decode_s,
        bound_by="prefill" if ttft > decode_s else "decode",
        prefill_side=prefill.bound,
        decode_side=decode.bound,
        concurrency=workload.concurrency,
        cost=workload_cost(workload, ttft, per_stream * workload.concurrency, price) if price is not None else None,
        meets_slo=slo is None or slo.met_by(ttft, 1 / per_stream),
    )


def at_slo(shape: ModelShape, hardware: Hardware, workload: RequestShape, slo: Slo, budget_bytes: float | None = None,
           usd_per_hour: float | None = None, max_concurrency: int = 1024) -> Advice:
    """The machine at the most concurrent requests (up to `max_concurrency`) that still fit and meet `slo`: where
    a token costs least while the SLO holds (ITL only grows with the batch, so bisect). The workload's own
    concurrency is the floor; if even that misses the SLO or does not fit, its advice says so."""

    def advice(concurrency: int) -> Advice:
        return advise_one(shape, hardware, RequestShape(workload.prompt_tokens, workload.output_tokens, concurrency),
                          budget_bytes, usd_per_hour, slo)

    floor = advice(workload.concurrency)
    if not (floor.fits and floor.meets_slo):
        return floor
    low, high = workload.concurrency, max(workload.concurrency, max_concurrency)
    while low < high:
        middle = (low + high + 1) // 2
        candidate = advice(middle)
        low, high = (middle, high) if candidate.fits and candidate.meets_slo else (low, middle - 1)
    return advice(low)


def advise(
    shape: ModelShape, machines: Iterable[Hardware], workload: RequestShape, budget_bytes: float | None = None,
    usd_per_hour: float | None = None, slo: Slo | None = None,
) -> list[Advice]:
    """Machines that fit, fastest request first, then those that do not (with why). Raises if none fit. With an
    `slo`, each machine is taken at the most concurrent requests that meet it (at_slo), where its tokens cost
    least; `usd_per_hour` prices every machine so instead of its catalogued price."""
    if slo is not None:
        advice = [at_slo(shape, hardware, workload, slo, budget_bytes, usd_per_hour) for hardware in machines]
    else:
        advice = [advise_one(shape, hardware, workload, budget_bytes, usd_per_hour) for hardware in machines]
    advice.sort(key=lambda a: (not a.fits, a.request_s))
    if not any(a.fits for a in advice):
        budget = f" within {budget_bytes / 1e9:,.0f} GB" if budget_bytes else ""
        raise RidgelineError(
            f"{shape.name} ({shape.weights}, {shape.total_weight_bytes / 1e9:,.1f} GB of weights) with "
            f"{workload.concurrency} x {workload.prompt_tokens + workload.output_tokens:,} tokens of KV does not fit "
            f"any catalogued machine{budget}"
        )
    return advice
