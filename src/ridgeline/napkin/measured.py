"""Measured operating points (from `bench latency --json` or `bench serve --json`) to place on a roofline.

The file is a JSON list of points, or an object whose "roofline_points" key holds that list (what
`bench serve --json` prints). A point is `{"label", "phase": "prefill"|"decode", "tokens_per_s",
"batch" (decode) | "prompt_tokens" (prefill), "context" (decode, optional)}`; `tokens_per_s` is aggregate
over the batch. The list `bench latency --json` prints (pp/tg results per weight mode) is read as well.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import RidgelineError
from ridgeline.napkin.roofline import Roofline, StepCost


@dataclass(frozen=True)
class MeasuredPoint:
    label: str
    phase: str
    tokens_per_s: float
    batch: int = 1
    prompt_tokens: int = 0
    context: int = 0

    def cost(self, roofline: Roofline) -> StepCost:
        """The modelled step this measurement ran: gives its intensity and FLOPs per token."""
        if self.phase == "prefill":
            return roofline.prefill_cost(self.prompt_tokens)
        return roofline.decode_cost(self.batch, self.context)

    def attained_flops(self, roofline: Roofline) -> float:
        cost = self.cost(roofline)
        return self.tokens_per_s * cost.flops / cost.tokens

    def fraction_of_ceiling(self, roofline: Roofline) -> float:
        estimate = roofline.estimate(self.cost(roofline))
        return self.tokens_per_s / estimate.tokens_per_s


def parse_points(data: object) -> list[MeasuredPoint]:
    if isinstance(data, dict):
        data = data.get("roofline_points")
    if not isinstance(data, list):
        raise RidgelineError("measured results must be a JSON list of points (or an object with 'roofline_points')")
    data = [point for item in data for point in _latency_points(item)]
    points = []
    for i, item in enumerate(data):
        phase = item.get("phase") if isinstance(item, dict) else None
        if phase not in ("prefill", "decode") or "tokens_per_s" not in item:
            raise RidgelineError(f"measured point {i} needs phase 'prefill' or 'decode' and tokens_per_s: {item!r}")
        if phase == "prefill" and not item.get("prompt_tokens"):
            raise RidgelineError(f"measured prefill point {i} needs prompt_tokens: {item!r}")
        points.append(
            MeasuredPoint(
                label=str(item.get("label", f"{phase} {i}")),
                phase=phase,
                tokens_per_s=float(item["tokens_per_s"]),
                batch=int(item.get("batch", 1)),
                prompt_tokens=int(item.get("prompt_tokens", 0)),
                context=int(item.get("context", 0)),
            )
        )
    return points


def _latency_points(item: object) -> list:
    """A `bench latency` result becomes its pp (prefill) and tg (batch-1 decode) points; anything else passes."""
    if not (isinstance(item, dict) and "pp_tok_s" in item and "tg_tok_s" in item):
        return [item]
    label = f"ridgeline {item.get('weights', '')}".strip()
    return [
        {"label": f"{label} pp{item['prompt_tokens']}", "phase": "prefill", "prompt_tokens": item["prompt_tokens"],
         "tokens_per_s": item["pp_tok_s"]["mean"]},
        {"label": f"{label} tg{item['gen_tokens']}", "phase": "decode", "batch": 1, "context": item["gen_tokens"] // 2,
         "tokens_per_s": item["tg_tok_s"]["mean"]},
    ]


def load_measured(path: str | Path) -> list[MeasuredPoint]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise RidgelineError(f"cannot read measured results {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise RidgelineError(f"measured results {path} are not JSON: {error}") from None
    return parse_points(data)
