"""`ridgeline bench serve`: load an OpenAI-compatible server and report latency, throughput and goodput."""

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ridgeline.bench.bench_serve import BenchServeConfig, LoadLevel, bench_serve, fetch_steps_figure, make_prompts
from ridgeline.workload.serve_metrics import PERCENTILES, Slo
from ridgeline.cli.app import bench_app
from ridgeline.dashboard.export import render_roofline
from ridgeline.errors import RidgelineError


def parse_list(text: str | None, kind: type, option: str) -> list:
    if text is None:
        return []
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise RidgelineError(f"{option} takes a comma-separated list of numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise RidgelineError(f"{option} values must be positive, got {text!r}")
    return values


def load_levels(concurrency: str | None, request_rate: str | None, trace: bool = False) -> list[LoadLevel]:
    """The load levels to run. A trace brings its arrival times: it is replayed as recorded, every request sent at
    its arrival whatever is in flight (as `simulate` replays it), unless --concurrency caps it."""
    concurrencies = parse_list(concurrency, int, "--concurrency")
    rates = parse_list(request_rate, float, "--request-rate")
    if not rates:
        if trace and not concurrencies:
            return [LoadLevel()]
        return [LoadLevel(concurrency=c) for c in concurrencies or [1]]
    if len(concurrencies) > 1:
        raise RidgelineError("with --request-rate, --concurrency takes one value (the in-flight cap)")
    cap = concurrencies[0] if concurrencies else None
    return [LoadLevel(concurrency=cap, request_rate=r) for r in rates]


@bench_app.command("serve", help="Load an OpenAI-compatible server (ridgeline, llama.cpp, vLLM) and report TTFT/ITL/TPOT/E2E and goodput.")
def bench_serve_command(
    base_url: str = typer.Option(..., "--base-url", help="Server root, e.g. http://127.0.0.1:8000 (loopback only unless --allow-remote)."),
    model: str = typer.Option(None, "--model", help="Model name to request (default: the first the server lists)."),
    endpoint: str = typer.Option("completions", "--endpoint", help="completions (/v1/completions) or chat (/v1/chat/completions)."),
    concurrency: str = typer.Option(None, "--concurrency", help="Comma-separated fixed concurrency levels, e.g. 1,4,8,16 (default 1; with --trace, none: every request at its recorded arrival)."),
    request_rate: str = typer.Option(None, "--request-rate", help="Comma-separated Poisson request rates (requests/s), one run each."),
    num_prompts: int = typer.Option(32, "--num-prompts", min=1, help="Requests per load level."),
    input_len: int = typer.Option(128, "--input-len", min=1, help="Synthetic prompt length in words (about one token each)."),
    output_len: int = typer.Option(64, "--output-len", min=1, help="Tokens to generate per request."),
    dataset: Path = typer.Option(None, "--dataset", help="JSONL file of {\"prompt\": ..., \"max_tokens\": ...} instead of synthetic prompts."),
    slo_ttft_ms: float = typer.Option(None, "--slo-ttft-ms", help="Goodput SLO: time to first token, ms."),
    slo_itl_ms: float = typer.Option(None, "--slo-itl-ms", help="Goodput SLO: a request's mean inter-token latency, ms."),
    max_seconds: float = typer.Option(300, "--max-seconds", min=1, help="Wall-clock limit per load level; running requests are cancelled."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--stop-at-eos", help="Ask the server to generate exactly --output-len tokens."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a server that is not on this machine."),
    seed: int = typer.Option(0, "--seed", help="Seed for synthetic prompts and Poisson arrivals."),
    trace: Path = typer.Option(None, "--trace", help="Replay a JSONL trace (arrival_s, prompt or prompt_ids, output_tokens) as recorded, each request at its arrival, as `simulate` reads it."),
    record: Path = typer.Option(None, "--record", help="Write the requests sent, with what each measured, as a replayable JSONL trace."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON (includes roofline_points for `roofline --measured`)."),
    plot: str = typer.Option(None, "--plot", help="Write PREFIX-latency.png and PREFIX-throughput.png, and from a ridgeline server PREFIX-roofline.png and .html: the run's steps on the roofline, as /dashboard draws them."),
) -> None:
    levels = load_levels(concurrency, request_rate, trace=trace is not None)
    config = BenchServeConfig(
        base_url=base_url.rstrip("/"),
        model=model,
        endpoint=endpoint,
        num_prompts=num_prompts,
        input_len=input_len,
        output_len=output_len,
        dataset=dataset,
        max_seconds=max_seconds,
        ignore_eos=ignore_eos,
        slo=Slo(slo_ttft_ms, slo_itl_ms),
        allow_remote=allow_remote,
        seed=seed,
        trace=trace,
        record=record,
    )
    console = Console(stderr=as_json)
    with Progress(console=console, transient=True) as progress:
        total = len(make_prompts(config)) if trace else num_prompts
        task = progress.add_task("requests", total=total * len(levels))
        report = bench_serve(config, levels, on_done=lambda result: progress.advance(task))
    if plot:
        report["plots"] = [str(p) for p in write_plots(report, plot)]
        figure = fetch_steps_figure(config.base_url, report["started_at"])
        if isinstance(figure, str):
            report["roofline_plot_skipped"] = figure
        else:
            report["plots"] += [str(render_roofline(figure, f"{plot}-roofline.{suffix}")) for suffix in ("png", "html")]
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print_report(console, report)


def write_plots(report: dict, prefix: str) -> list[Path]:
    from ridgeline.napkin.plot import plot_latency_vs_load, plot_throughput_vs_load

    levels = report["levels"]
    by_rate = levels[0]["load"]["request_rate"] is not None
    loads = [level["load"]["request_rate" if by_rate else "concurrency"] for level in levels]
    label = "request rate (requests/s)" if by_rate else "concurrency"
    latencies = {
        f"{metric.upper()} {stat}": [level[f"{metric}_ms"][stat] or float("nan") for level in levels]
        for metric in ("ttft", "itl", "e2e")
        for stat in ("p50", "p99")
    }
    return [
        plot_latency_vs_load(loads, latencies, label, f"{prefix}-latency.png"),
        plot_throughput_vs_load(loads, [level["output_tokens_per_s"] for level in levels], label, f"{prefix}-throughput.png"),
    ]


def level_label(level: dict) -> str:
    load = level["load"]
    return load.get("label") or LoadLevel(load["concurrency"], load["request_rate"]).label


def print_report(console: Console, report: dict, title: str | None = None) -> None:
    levels = report["levels"]
    table = Table(title=title or f"bench serve: {report['config']['base_url']} ({levels[0]['model']})")
    table.add_column("metric")
    for level in levels:
        table.add_column(level_label(level), justify="right")

    def row(name: str, values: list[str]) -> None:
        table.add_row(name, *values)

    row("completed / failed", [f"{lv['completed']} / {lv['failed']}" for lv in levels])
    row("duration s", [f"{lv['duration_s']:.2f}" for lv in levels])
    row("requests/s", [f"{lv['request_throughput']:.2f}" for lv in levels])
    row("output tok/s", [f"{lv['output_tokens_per_s']:.1f}" for lv in levels])
    row("tokens counted by", ["server usage" if lv["usage_reported"] else "chunks" for lv in levels])
    for metric in ("ttft", "itl", "tpot", "e2e"):
        for stat in ("mean", *(f"p{p}" for p in PERCENTILES)):
            values = [lv[f"{metric}_ms"][stat] for lv in levels]
            row(f"{metric.upper()} {stat} ms", ["-" if v is None else f"{v:,.1f}" for v in values])
    slo = report["config"]["slo"]
    if slo["ttft_ms"] is not None or slo["itl_ms"] is not None:
        row("goodput req/s", [f"{lv['goodput']:.2f} ({lv['good_requests']}/{lv['completed']})" for lv in levels])
    if "engine" in levels[0]:  # a simulated run also sees inside the engine
        engines = [lv["engine"] for lv in levels]
        row("KV occupancy mean / peak", [f"{e['kv_occupancy_mean']:.0%} / {e['kv_occupancy_peak']:.0%}" for e in engines])
        row("preemptions", [f"{e['preemptions']:,}" for e in engines])
        row("prefix hit rate", [f"{e['prefix_hit_rate']:.1%}" for e in engines])
        if any(e["kv_transfers"] for e in engines):
            row("KV transfers (waits for room)", [f"{e['kv_transfers']:,} ({e['kv_transfer_waits']:,})" for e in engines])
    console.print(table)
    for level in levels:
        for error in level["errors"]:
            console.print(f"[red]{level_label(level)}:[/] {error}")
    for path in report.get("plots", []):
        console.print(f"wrote {path}")
    if "roofline_plot_skipped" in report:
        console.print(f"no roofline plot: {report['roofline_plot_skipped']}")
