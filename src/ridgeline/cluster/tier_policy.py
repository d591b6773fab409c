"""Tier routing for the virtual model `auto`: which model is worth its cost for this prompt.

Each candidate model m (its best replica already chosen) has a predicted cost c_m in seconds (cost.py: queue +
uncached prefill + expected decode, so a busy large model costs more) and a quality figure q_m from an
evaluation (config). The prompt has a difficulty d in [0, 1] (longer prompts and ones asking for reasoning or
code want the better model). The router picks the model maximising

    d * q_m - threshold * c_m

so one number, the threshold (quality given up per second saved), sets the trade: 0 sends everything to the best
model, a large one everything to the cheapest. `calibrate` finds the threshold that sends a target share of a
traffic sample to the best model.

Or the router minimises money instead (`objective = "cost"`): among the models whose predicted TTFT and ITL for
this request meet the SLO, the one whose machine time for it costs least (each backend's hourly price over its
predicted prefill and decode rates: `decide_cheapest`); when none meets the SLO, the one that misses it least.
"""

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

# Prompt lengths (tokens) mapped to difficulty 0 and 1 on a log scale.
SHORT_PROMPT, LONG_PROMPT = 8, 1024
# Phrases that ask for more than recall; each adds to the difficulty. Matched on the lower-cased text with the
# word boundary factored out: 4.4x faster than the same alternatives under re.IGNORECASE, the same matches.
HARD_MARKERS = re.compile(r"```|\b(?:def |class |prove\b|explain\b|why\b|step by step\b|analy[sz]e\b|compare\b|"
                          r"derive\b|calculate\b|solve\b)|[=+*/^]\s*\d")
MARKER_WEIGHT = 0.15
MAX_MARKERS = 2  # counted up to this many: more add nothing, so the scan stops there
# Of a longer text, markers are looked for in its first and last characters only. The question sits at one end of
# what a user pastes ("Summarise this: ...", "... Why does it fail?"), and the scan runs on the router's event loop
# for every `auto` request, at about 0.15 us a character with no marker (2.4 ms for 16,000 on this 2-core machine,
# busy): a 4 MiB body scanned whole would hold every other request for a second.
MARKER_HEAD_CHARS, MARKER_TAIL_CHARS = 4_000, 12_000
LENGTH_WEIGHT = 0.7


@dataclass(frozen=True)
class TierCandidate:
    model: str
    quality: float
    cost_s: float
    replica: str | None = None
    usd: float | None = None  # what this request's machine time costs on it (None: the backend has no price)
    ttft_s: float | None = None  # predicted: queue + uncached prefill
    itl_s: float | None = None  # predicted: decode time per output token at the replica's counted load


@dataclass(frozen=True)
class TierDecision:
    model: str
    replica: str | None
    difficulty: float
    threshold: float
    scores: dict[str, float]
    costs: dict[str, float]
    # "only_candidate", "quality_worth_cost" (took the best model) or "cost" (took a cheaper one); with the cost
    # objective "cheapest_in_slo" or "slo_missed" (none met it: the least late)
    kind: str
    reason: str
    usd: dict[str, float] = field(default_factory=dict)

    def as_log(self) -> dict:
        log = {"model": self.model, "replica": self.replica, "difficulty": round(self.difficulty, 3),
               "threshold": self.threshold, "kind": self.kind, "reason": self.reason,
               "costs_s": {m: round(c, 4) for m, c in self.costs.items()},
               "scores": {m: round(s, 4) for m, s in self.scores.items()}}
        return log | ({"usd": {m: round(u, 9) for m, u in self.usd.items()}} if self.usd else {})


def marker_span(text: str) -> str:
    """What of `text` is scanned for markers: all of it up to MARKER_HEAD_CHARS + MARKER_TAIL_CHARS, else its two
    ends (joined by a line break, so no marker is made across the cut)."""
    if len(text) <= MARKER_HEAD_CHARS + MARKER_TAIL_CHARS:
        return text
    return text[:MARKER_HEAD_CHARS] + "\n" + text[-MARKER_TAIL_CHARS:]


def count_markers(text: str | None) -> int:
    if not text:
        return 0
    return sum(1 for _ in itertools.islice(HARD_MARKERS.finditer(marker_span(text).lower()), MAX_MARKERS))


def difficulty(prompt_tokens: int, text: str | None = None) -> float:
    """`text`: what the user asks now (the last user turn of a chat, a completion's prompt)."""
    span = math.log(LONG_PROMPT / SHORT_PROMPT)
    length = min(1.0, max(0.0, math.log(max(prompt_tokens, 1) / SHORT_PROMPT) / span))
    return min(1.0, LENGTH_WEIGHT * length + MARKER_WEIGHT * count_markers(text))


def decide(candidates: Sequence[TierCandidate], hardness: float, threshold: float) -> TierDecision:
    if not candidates:
        raise ValueError("no candidate model")
    scores = {c.model: hardness * c.quality - threshold * c.cost_s for c in candidates}
    best = max(candidates, key=lambda c: (scores[c.model], c.quality))
    top_quality = max(candidates, key=lambda c: c.quality)
    cheapest = min(candidates, key=lambda c: c.cost_s)
    if len(candidates) == 1:
        kind, reason = "only_candidate", "only candidate"
    elif best is top_quality:
        kind = "quality_worth_cost"
        reason = f"difficulty {hardness:.2f} worth {best.cost_s - cheapest.cost_s:.3f}s more than {cheapest.model}"
    else:
        kind = "cost"
        reason = (f"difficulty {hardness:.2f} not worth {top_quality.cost_s - best.cost_s:.3f}s more for "
                  f"{top_quality.model} at threshold {threshold:g}")
    return TierDecision(best.model, best.replica, hardness, threshold, scores,
                        {c.model: c.cost_s for c in candidates}, kind, reason)


def slo_lateness(candidate: TierCandidate, slo_ttft_s: float | None, slo_itl_s: float | None) -> float:
    """How far the candidate's predicted latency is over the SLO, as the worst ratio to its target (<= 1: met)."""
    ratios = [0.0]
    if slo_ttft_s is not None:
        ratios.append((candidate.ttft_s or 0.0) / slo_ttft_s)
    if slo_itl_s is not None:
        ratios.append((candidate.itl_s or 0.0) / slo_itl_s)
    return max(ratios)


def decide_cheapest(candidates: Sequence[TierCandidate], hardness: float, slo_ttft_s: float | None,
                    slo_itl_s: float | None) -> TierDecision:
    """The candidate whose machine time for this request costs least among those predicted to meet the SLO (equal
    prices: the better model); none meets it: the one that misses it by least."""
    if not candidates:
        raise ValueError("no candidate model")
    unpriced = [c.model for c in candidates if c.usd is None]
    if unpriced:
        raise ValueError(f"the cost objective needs a price for every model; none for {', '.join(unpriced)}")
    lateness = {c.model: slo_lateness(c, slo_ttft_s, slo_itl_s) for c in candidates}
    meeting = [c for c in candidates if lateness[c.model] <= 1.0]
    if meeting:
        best = min(meeting, key=lambda c: (c.usd, -c.quality))
        kind = "only_candidate" if len(candidates) == 1 else "cheapest_in_slo"
        reason = f"${best.usd:.3g} for this request, cheapest of {len(meeting)} meeting the SLO"
    else:
        best = min(candidates, key=lambda c: (lateness[c.model], c.usd))
        kind = "slo_missed"
        reason = f"no model meets the SLO; {best.model} misses it least ({lateness[best.model]:.2f}x its target)"
    return TierDecision(best.model, best.replica, hardness, 0.0, {m: -late for m, late in lateness.items()},
                        {c.model: c.cost_s for c in candidates}, kind, reason, {c.model: c.usd for c in candidates})


def large_share(sample: Sequence[tuple[float, Sequence[TierCandidate]]], threshold: float) -> float:
    """Share of the sample (difficulty, candidates) sent to its best-quality model at `threshold`."""
    hits = 0
    for hardness, candidates in sample:
        top = max(candidates, key=lambda c: c.quality).model
        hits += decide(candidates, hardness, threshold).model == top
    return hits / len(sample)


def calibrate(sample: Sequence[tuple[float, Sequence[TierCandidate]]], target_share: float,
              iterations: int = 60) -> float:
    """The threshold whose share of large-model calls on `sample` is closest to target_share (the share only
    falls as the threshold rises, so bisect on its logarithm)."""
    if not sample:
        raise ValueError("calibration needs a non-empty traffic sample")
    if not 0.0 <= target_share <= 1.0:
        raise ValueError(f"target share must lie in [0, 1], got {target_share}")
    low, high = -12.0, 12.0  # log10 of the threshold
    for _ in range(iterations):
        middle = (low + high) / 2
        if large_share(sample, 10**middle) > target_share:
            low = middle
        else:
            high = middle
    candidates = (10**low, 10**high)
    return min(candidates, key=lambda t: abs(large_share(sample, t) - target_share))
