"""Charts: a model's operating points on a machine's roofline, and serving latency/throughput under load."""

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ridgeline.napkin.measured import MeasuredPoint  # noqa: E402
from ridgeline.napkin.roofline import Roofline  # noqa: E402

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
    decode = [(b, roofline.decode_cost(b, context).intensity) for b in decode_batches]  # at `context` tokens each
    prefill = [(n, roofline.prefill_cost(n).intensity) for n in prefill_lengths]
    measured_xy = [(p, p.cost(roofline).intensity, p.attained_flops(roofline)) for p in measured]
    intensities = [x for _, x in decode + prefill] + [x for _, x, _ in measured_xy] + [roofline.ridge]
    x = np.logspace(np.log10(min(intensities) / 4), np.log10(max(intensities) * 4), 200)

    figure, axes = plt.subplots(figsize=(8, 5.5), dpi=120)
    axes.loglog(x, [roofline.attainable_flops(i) for i in x], color="black", linewidth=2, label="roof")
    axes.axvline(roofline.ridge, color="grey", linestyle=":", label=f"ridge {roofline.ridge:,.0f} FLOP/B")
    for label, points, marker, colour, prefix, offset in (
        ("decode at batch b", decode, "o", "tab:blue", "b=", (4, -12)),
        ("prefill of L tokens", prefill, "s", "tab:orange", "L=", (-4, 7)),
    ):
        xs = [i for _, i in points]
        axes.scatter(xs, [roofline.attainable_flops(i) for i in xs], marker=marker, color=colour, zorder=3, label=label)
        for n, i in points:
            axes.annotate(f"{prefix}{n:,}", (i, roofline.attainable_flops(i)), textcoords="offset points", xytext=offset, fontsize=7, color=colour)
    for point, intensity, flops in measured_xy:
        axes.scatter([intensity], [flops], marker="*", s=120, color="tab:red", zorder=4)
        axes.annotate(point.label, (intensity, flops), textcoords="offset points", xytext=(5, 4), fontsize=8, color="tab:red")
    if measured_xy:
        axes.scatter([], [], marker="*", s=120, color="tab:red", label="measured")
    shape, hardware = roofline.shape, roofline.hardware
    axes.set_title(f"{shape.name} ({shape.weights}) on {hardware.title}, decode at {context:,} tokens of context", fontsize=9)
    axes.set_xlabel("arithmetic intensity (FLOP / byte)")
    axes.set_ylabel(f"attainable FLOP/s ({roofline.precision})")
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


def _save(figure: plt.Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
