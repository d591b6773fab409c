"""`ridgeline bench throughput`: offline aggregate decode tok/s per batch size, beside the roofline's prediction."""

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ridgeline.cli.app import bench_app
from ridgeline.cli.engine_options import KV_CACHE_DTYPE, KV_CACHE_DTYPE_K, KV_CACHE_DTYPE_V
from ridgeline.engine.options import engine_config
from ridgeline.errors import RidgelineError

if TYPE_CHECKING:
    from ridgeline.bench.bench_throughput import ThroughputConfig, ThroughputReport


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise RidgelineError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise RidgelineError(f"--batch-sizes must be positive integers, got {text!r}")
    return sizes


@bench_app.command("throughput", help="Aggregate decode tok/s at each batch size (offline, all requests at once), beside the roofline's ceiling.")
def throughput_command(
    model: Path = typer.Option(None, "--model", help="GGUF file or HF directory (default: the bundled model)."),
    batch_sizes: str = typer.Option(None, "--batch-sizes", help="Comma-separated numbers of concurrent sequences (default: 1,2,4,8,16,32,64)."),
    input_len: int = typer.Option(128, "--input-len", min=1, help="Prompt tokens per request (random ids)."),
    output_len: int = typer.Option(128, "--output-len", min=2, help="Tokens each request generates (EOS ignored)."),
    threads: int = typer.Option(None, "--threads", min=1, help="torch threads (default: torch's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON (usable as `ridgeline roofline --measured`)."),
    plot: Path = typer.Option(None, "--plot", help="Write a roofline chart (PNG) with the measured decode points on it."),
    kv_cache_dtype: str = KV_CACHE_DTYPE,
    kv_cache_dtype_k: str = KV_CACHE_DTYPE_K,
    kv_cache_dtype_v: str = KV_CACHE_DTYPE_V,
) -> None:
    # Imported here, not at the top: every command module is imported for `ridgeline --help`, which needs no torch.
    from ridgeline.bench.bench_throughput import DEFAULT_BATCH_SIZES, ThroughputConfig, run_throughput

    sizes = parse_batch_sizes(batch_sizes) if batch_sizes is not None else DEFAULT_BATCH_SIZES
    engine = engine_config(model, threads=threads, kv_cache_dtype=kv_cache_dtype, kv_cache_dtype_k=kv_cache_dtype_k,
                           kv_cache_dtype_v=kv_cache_dtype_v)
    config = ThroughputConfig(engine, sizes, input_len, output_len)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=sum(sizes) * output_len)
        report = run_throughput(config, lambda text, tokens: bar.update(task, description=text, advance=tokens))
    summary = report.summary()
    if plot:
        summary["plot"] = str(write_plot(report, config, plot))
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    print_report(report, config, summary.get("plot"))


def write_plot(report: "ThroughputReport", config: "ThroughputConfig", path: Path) -> Path:
    from ridgeline.model.model_source import load_model_shape
    from ridgeline.napkin.measured import parse_points
    from ridgeline.napkin.plot import plot_roofline
    from ridgeline.napkin.roofline import Roofline

    roofline = Roofline(load_model_shape(config.engine.model), report.hardware,
                        kv_dtype_bytes=config.engine.kv_cache.bytes_per_value)
    points = parse_points(report.summary()["roofline_points"])
    context = config.input_len + config.output_len // 2
    return plot_roofline(roofline, path, context=context, decode_batches=config.batch_sizes, measured=points)


def print_report(report: "ThroughputReport", config: "ThroughputConfig", plot: str | None) -> None:
    table = Table(title=f"{report.model}, {report.threads} threads, {config.input_len} in / {config.output_len} out "
                        "per request")
    for column in ("batch", "prefill s", "prefill tok/s", "decode s", "decode tok/s", "roofline", "% roof", "preempt"):
        table.add_column(column, justify="right")
    for r in report.results:
        table.add_row(str(r.batch), f"{r.prefill_s:.2f}", f"{r.prefill_tok_s:,.1f}", f"{r.decode_s:.2f}",
                      f"{r.decode_tok_s:,.1f}", f"{r.roofline_tok_s:,.0f}", f"{r.fraction_of_roofline:.1%}", str(r.preemptions))
    console = Console()
    console.print(table)
    hardware = report.hardware
    console.print(f"roofline = the napkin decode ceiling in tok/s for {hardware.title}, {hardware.bandwidth / 1e9:.1f} GB/s, "
                  f"{hardware.flops(report.precision) / 1e9:.0f} GFLOP/s {report.precision}; weights as stored in the file, "
                  f"at the average context of {config.input_len + config.output_len // 2} tokens. "
                  "decode tok/s = tokens after the last request's first token / time after it.", highlight=False)
    if plot:
        console.print(f"plot: {plot}")
