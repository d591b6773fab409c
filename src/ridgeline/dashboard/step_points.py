"""A recorded step (as /v1/steps serves it) as a point on the roofline, with the hover text the picture shows."""

from ridgeline.napkin.roofline import Roofline
from ridgeline.napkin.roofline_figure import FigurePoint, fraction_of_roof, scaled


def composition(step: dict) -> str:
    """'12 decode rows at context 40-180 (mean 95) + prefill 256 tokens from 0'."""
    parts = []
    context = step["decode_context"]
    if context:
        rows = step["decode_rows"]
        where = (f"context {context['min']:,}" if context["min"] == context["max"]
                 else f"contexts {context['min']:,}-{context['max']:,} (mean {context['mean']:,.0f})")
        parts.append(f"{rows} decode row{'s' if rows > 1 else ''} at {where}")
    for chunk in step["prefill_chunks"]:
        parts.append(f"prefill {chunk['tokens']:,} tokens from {chunk['start']:,}")
    return " + ".join(parts)


def step_point(step: dict, roofline: Roofline) -> FigurePoint:
    x, y = step["intensity"], step["flops_per_s"]
    share = fraction_of_roof(roofline, x, y)
    detail = (
        f"{step['kind']} step #{step['index']}: {step['seconds'] * 1e3:,.2f} ms, {step['tokens']:,} token{'s' if step['tokens'] > 1 else ''}",
        composition(step),
        f"read {step['weight_bytes'] / 1e6:,.1f} MB of weights + {step['kv_bytes'] / 1e6:,.2f} MB of KV",
        f"{scaled(step['flops'])}FLOP at {x:,.2f} FLOP/B: {scaled(y)}FLOP/s = {share:.1%} of the roof there",
    )
    return FigurePoint(x, y, step["kind"], f"#{step['index']}", detail)
