"""Charts: a model's operating points on a machine's roofline, and serving latency/throughput under load."""

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ridgeline.napkin.measured import MeasuredPoint  # noqa: E402
from ridgeline.napkin.roofline import Roofline  # noqa: E402
from ridgeline.napkin.roofline_figure import FigurePoint, roofline_figure  # noqa: E402

DECODE_BATCHES = (1, 4, 16, 64, 256)
PREFILL_LENGTHS = (16, 128, 512, 2048, 8192)


def plot_roofline(
    roofline: Roofline,
    path: str | Path,
    context: int = 0,
    decode_batches: Sequence[int] = DECODE_BATCHES,
    prefill_lengths: Sequence[int] = PREFILL_LENGTHS,
    measured: Sequence[MeasuredPoint] = (),
) -> Path:
    """Log-log roofline with modelled decode (per batch) and prefill (per prompt length) points on the roof."""
    return render_roofline_png(modelled_figure(roofline, context, decode_batches, prefill_lengths, measured), path)


def modelled_figure(
    roofline: Roofline,
    context: int = 0,
    decode_batches: Sequence[int] = DECODE_BATCHES,
    prefill_lengths: Sequence[int] = PREFILL_LENGTHS,
    measured: Sequence[MeasuredPoint] = (),
) -> dict:
    """The `roofline_figure` of `ridgeline roofline --plot`: modelled points on the roof, measured ones where they ran."""
    points = []
    for kind, prefix, costs in (
        ("model-decode", "b=", [(b, roofline.decode_cost(b, context)) for b in decode_batches]),  # at `context` tokens each
        ("model-prefill", "L=", [(n, roofline.prefill_cost(n)) for n in prefill_lengths]),
    ):
        for n, cost in costs:
            points.append(FigurePoint(cost.intensity, roofline.attainable_flops(cost.intensity), kind, f"{prefix}{n:,}", annotate=True))
    for point in measured:
        cost = point.cost(roofline)
        points.append(FigurePoint(cost.intensity, point.attained_flops(roofline), "measured", point.label, annotate=True))
    shape, hardware = roofline.shape, roofline.hardware
    title = f"{shape.name} ({shape.weights}) on {hardware.title}, decode at {context:,} tokens of context"
    return roofline_figure(roofline, points, title)


# How each kind of point is drawn (matplotlib's marker, size) and where its label goes.
MARKERS = {"model-decode": ("o", 36, (4, -12)), "model-prefill": ("s", 36, (-4, 7)), "measured": ("*", 120, (5, 4))}
STEP_MARKER = ("o", 14, (4, 4))


def render_roofline_png(figure_data: dict, path: str | Path) -> Path:
    """Draw a `roofline_figure` (the dashboard draws the same data on a canvas)."""
    ridge, peak, bandwidth = figure_data["ridge"], figure_data["peak_flops"], figure_data["bandwidth"]
    x = np.logspace(*np.log10(figure_data["x_range"]), 200)
    figure, axes = plt.subplots(figsize=(8, 5.5), dpi=120)
    axes.loglog(x, np.minimum(peak, bandwidth * x), color="black", linewidth=2,
                label=f"roof: {figure_data['ceilings']['memory']}, {figure_data['ceilings']['compute']}")
    axes.axvline(ridge, color="grey", linestyle=":", label=figure_data["ceilings"]["ridge"])
    by_kind: dict[str, list[dict]] = {}
    for point in figure_data["points"]:
        by_kind.setdefault(point["kind"], []).append(point)
    for kind, points in by_kind.items():
        style = figure_data["kinds"][kind]
        marker, size, offset = MARKERS.get(kind, STEP_MARKER)
        axes.scatter([p["x"] for p in points], [p["y"] for p in points], marker=marker, s=size, color=style["colour"],
                     alpha=1.0 if kind in MARKERS else 0.6, zorder=3, label=style["label"])
        for p in points:
            if p["annotate"]:
                axes.annotate(p["label"], (p["x"], p["y"]), textcoords="offset points", xytext=offset, fontsize=7, color=style["colour"])
    axes.set_xlim(*figure_data["x_range"])
    axes.set_ylim(*figure_data["y_range"])
    axes.set_title(figure_data["title"], fontsize=9)
    axes.set_xlabel(figure_data["x_label"])
    axes.set_ylabel(figure_data["y_label"])
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    return _save(figure, path)


def plot_latency_vs_load(loads: Sequence[float], latencies_ms: dict[str, Sequence[float]], load_label: str, path: str | Path) -> Path:
    """One line per latency metric (e.g. "TTFT p50") against the offered load (concurrency or request rate)."""
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, values in latencies_ms.items():
        axes.plot(loads, values, marker="o", label=name)
    axes.set_xlabel(load_label)
    axes.set_ylabel("latency (ms)")
    axes.set_yscale("log")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("latency vs load", fontsize=10)
    return _save(figure, path)


def plot_throughput_vs_load(loads: Sequence[float], output_tokens_per_s: Sequence[float], load_label: str, path: str | Path) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    axes.plot(loads, output_tokens_per_s, marker="o", color="tab:green")
    axes.set_xlabel(load_label)
    axes.set_ylabel("output tokens/s (all streams)")
    axes.grid(True, alpha=0.3)
    axes.set_title(f"throughput vs {load_label}", fontsize=10)
    return _save(figure, path)


def plot_measured_vs_simulated(points: dict[str, Sequence[tuple[str, float, float]]], path: str | Path,
                               title: str) -> Path:
    """One panel per metric: each load level's (label, measured, predicted) against the diagonal, with the
    ±20 % band, so a model that is right sits on the line and a biased one beside it."""
    columns = 3
    figure, grid = plt.subplots(-(-len(points) // columns), columns, figsize=(12, 7.5), dpi=120, squeeze=False)
    for axes, (name, rows) in zip(grid.flat, points.items()):
        measured, predicted = [r[1] for r in rows], [r[2] for r in rows]
        low, high = min(measured + predicted) * 0.8, max(measured + predicted) * 1.25
        line = np.array([low, high])
        axes.fill_between(line, line / 1.2, line * 1.2, color="grey", alpha=0.15, label="±20 %")
        axes.plot(line, line, color="black", linewidth=0.8)
        axes.scatter(measured, predicted, s=18, color="tab:blue", zorder=3)
        for label, x, y in rows:
            axes.annotate(label, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
        axes.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), title=name,
                 xlabel="measured", ylabel="simulated")
        for axis in (axes.xaxis, axes.yaxis):  # a narrow log range labels its minor ticks on top of each other
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes.grid(True, which="both", alpha=0.3)
    for axes in list(grid.flat)[len(points):]:
        axes.set_visible(False)
    grid.flat[0].legend(fontsize=8, loc="upper left")
    figure.suptitle(title, fontsize=10)
    return _save(figure, path)


def plot_cost_per_token(rows: Sequence[dict], path: str | Path, title: str) -> Path:
    """Grouped bars, one group per case (model, workload), one bar per machine: rows of {"case", "hardware",
    "usd_per_mtok"}, None where the machine cannot serve the case at its SLO (marked x on the axis)."""
    cases = list(dict.fromkeys(r["case"] for r in rows))
    machines = list(dict.fromkeys(r["hardware"] for r in rows))
    value = {(r["case"], r["hardware"]): r["usd_per_mtok"] for r in rows}
    width = 0.8 / len(machines)
    figure, axes = plt.subplots(figsize=(10, 5), dpi=120)
    known = [v for v in value.values() if v]
    floor = min(known) / 2 if known else 1e-3
    for i, machine in enumerate(machines):
        xs = np.arange(len(cases)) + (i - (len(machines) - 1) / 2) * width
        ys = [value.get((case, machine)) for case in cases]
        axes.bar([x for x, y in zip(xs, ys) if y], [y for y in ys if y], width, label=machine)
        missing = [x for x, y in zip(xs, ys) if not y]
        axes.scatter(missing, [floor] * len(missing), marker="x", color="black", zorder=3)
    axes.set_yscale("log")
    axes.set_xticks(np.arange(len(cases)), cases, rotation=15, fontsize=8, ha="right")
    axes.set_ylabel("US $ per million tokens (prompt + completion)")
    axes.grid(True, axis="y", which="both", alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title(title + " (x: cannot serve it within the SLO)", fontsize=9)
    return _save(figure, path)


def _save(figure: plt.Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
