"""The one definition of the roofline picture: a plain-data figure that every renderer draws the same way.

`roofline_figure` decides what is on the chart (the roof from this machine's bandwidth and peak, the ridge, the
axis ranges, points coloured by kind with their hover text); the renderers only draw it: matplotlib for PNG
(`napkin/plot.py`: `ridgeline roofline --plot`, `bench serve --plot`), and the dashboard's canvas script, live in
the server's /dashboard and inlined into a self-contained HTML export. So the picture a benchmark leaves behind
is the picture the dashboard showed.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ridgeline.napkin.roofline import Roofline

# Colours and legend labels per point kind (the dashboard's CSS legend uses the same table via the figure).
KINDS = {
    "decode": ("#1f77b4", "decode steps"),
    "prefill": ("#ff7f0e", "prefill steps"),
    "mixed": ("#9467bd", "mixed steps (decode rows + a prefill chunk)"),
    "model-decode": ("#1f77b4", "modelled decode at batch b"),
    "model-prefill": ("#ff7f0e", "modelled prefill of L tokens"),
    "measured": ("#d62728", "measured"),
}
PADDING = 4.0  # the axes reach this factor beyond the outermost point or the ridge


@dataclass(frozen=True)
class FigurePoint:
    x: float  # arithmetic intensity, FLOP/byte
    y: float  # FLOP/s (achieved, or attainable for a modelled point)
    kind: str  # a key of KINDS
    label: str = ""  # written beside the point when `annotate`
    detail: tuple[str, ...] = ()  # hover lines
    annotate: bool = False

    def to_json(self) -> dict:
        return {"x": self.x, "y": self.y, "kind": self.kind, "label": self.label, "detail": list(self.detail),
                "annotate": self.annotate}


def axis_range(values: Iterable[float], padding: float = PADDING) -> list[float]:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return [min(values) / padding, max(values) * padding]


def roofline_figure(roofline: Roofline, points: Iterable[FigurePoint] = (), title: str | None = None) -> dict:
    """Everything a renderer needs, as JSON-ready data; the roof is y = min(peak, bandwidth * x)."""
    points = list(points)
    hardware, shape = roofline.hardware, roofline.shape
    ridge, peak, bandwidth = roofline.ridge, roofline.peak_flops, hardware.bandwidth
    x_range = axis_range([ridge, *(p.x for p in points)])
    y_range = axis_range([bandwidth * x_range[0], peak, *(p.y for p in points)], padding=1.5)
    return {
        "title": title or f"{shape.name} ({shape.weights}) on {hardware.title}",
        "x_label": "arithmetic intensity (FLOP / byte)",
        "y_label": f"FLOP/s ({roofline.precision})",
        "bandwidth": bandwidth,
        "peak_flops": peak,
        "ridge": ridge,
        "ceilings": {
            "memory": f"memory {bandwidth / 1e9:,.1f} GB/s",
            "compute": f"peak {scaled(peak)}FLOP/s {roofline.precision}",
            "ridge": f"ridge {ridge:,.1f} FLOP/B",
        },
        "x_range": x_range,
        "y_range": y_range,
        "kinds": {kind: {"colour": colour, "label": label} for kind, (colour, label) in KINDS.items()},
        "points": [p.to_json() for p in points],
    }


def scaled(value: float) -> str:
    """'1.23 T' for 1.23e12: a figure with its SI prefix, ready for a unit."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:,.3g} {prefix}"
    return f"{value:,.3g} "


def fraction_of_roof(roofline: Roofline, intensity: float, flops_per_s: float) -> float:
    """Achieved FLOP/s over what the roof allows at that intensity."""
    return flops_per_s / roofline.attainable_flops(intensity)
