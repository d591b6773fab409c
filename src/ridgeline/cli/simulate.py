"""`ridgeline simulate`: serve a workload with ridgeline's own scheduler under a virtual clock, on a catalogue
machine (roofline step time) or on this one (a calibrated profile), and report it as bench serve does."""

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from ridgeline.cli.app import app
from ridgeline.cli.bench_serve import parse_list, print_report, write_plots
from ridgeline.cli.engine_options import ITL_TARGET_MS
from ridgeline.engine.options import parse_bytes, parse_itl_target
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.errors import RidgelineError
from ridgeline.napkin.hardware import THIS_MACHINE, price_of
from ridgeline.napkin.kv_dtypes import parse_kv_bytes
from ridgeline.workload.serve_metrics import Slo
from ridgeline.sim.link import Link
from ridgeline.workload.trace import read_trace
from ridgeline.sim.workload import Workload, from_trace, synthetic

if TYPE_CHECKING:  # the rest load torch (through the engine's types): imported where the command runs
    from ridgeline.sim.setup import SimOptions
    from ridgeline.sim.simulator import Deployment


def workloads(spec: str, deploy: "Deployment", model: str | None, *, num_prompts: int, input_len: int, output_len: int,
              shared_prefix_len: int, max_concurrency: int | None, seed: int) -> list[Workload]:
    """`rate:R1,R2`, `concurrency:N1,N2` or a trace file."""
    kind, _, values = spec.partition(":")
    vocab = deploy.shape.vocab_size
    if kind in ("rate", "poisson") and values:
        return [synthetic(num_prompts, input_len, output_len, vocab, rate=rate, concurrency=max_concurrency,
                          shared_prefix_len=shared_prefix_len, seed=seed)
                for rate in parse_list(values, float, "--workload rate:")]
    if kind == "concurrency" and values:
        return [synthetic(num_prompts, input_len, output_len, vocab, concurrency=n, shared_prefix_len=shared_prefix_len,
                          seed=seed) for n in parse_list(values, int, "--workload concurrency:")]
    if not Path(spec).exists():
        raise RidgelineError(f"--workload must be rate:R[,R...], concurrency:N[,N...] or a trace file; {spec!r} is none")
    rows = read_trace(spec)
    tokenize = None
    if any(r.prompt_ids is None and r.prompt is not None and r.prompt_tokens is None for r in rows) and model \
            and Path(model).exists():
        from ridgeline.model.checkpoint import read_checkpoint

        tokenize = read_checkpoint(model).load_tokenizer().encode
    return [from_trace(rows, vocab, tokenize, max_concurrency, seed, label=Path(spec).name)]


def load_of(workload: Workload) -> dict:
    return {"concurrency": workload.concurrency, "request_rate": workload.rate, "label": workload.label}


@app.command("simulate", help="Simulate serving with ridgeline's own scheduler on a catalogue machine or this one (calibrated): TTFT/ITL/TPOT/E2E, goodput, KV occupancy.")
def simulate_command(
    model: str = typer.Option(None, "--model", help="GGUF file, HF directory or built-in spec name (default: the bundled model)."),
    weights: str = typer.Option(None, "--weights", help="Weight format for a built-in spec: FP16, BF16, Q8_0, Q6_K, Q4_0, Q4_K_M, MXFP4."),
    hardware: str = typer.Option(None, "--hardware", help="Catalogue machine (roofline step time); omit with --calibrated."),
    workload: str = typer.Option("rate:1", "--workload", help="rate:R[,R...] (Poisson, one run each), concurrency:N[,N...], or a JSONL trace (bench serve --record)."),
    num_prompts: int = typer.Option(1000, "--num-prompts", min=1, help="Requests per synthetic load level."),
    input_len: int = typer.Option(512, "--input-len", min=1, help="Synthetic prompt tokens."),
    output_len: int = typer.Option(128, "--output-len", min=1, help="Tokens to generate per request."),
    shared_prefix_len: int = typer.Option(0, "--shared-prefix-len", min=0, help="Leading prompt tokens every synthetic request shares (prefix-cache hits)."),
    max_concurrency: int = typer.Option(None, "--max-concurrency", min=1, help="With a rate or trace: at most this many requests in flight."),
    seed: int = typer.Option(0, "--seed", help="Seed for synthetic prompts and Poisson arrivals (bench serve's arrivals for the same seed), and for the measured step-time jitter a calibrated profile draws from."),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens", min=1, help="Tokens computed per step (the chunk budget)."),
    max_num_seqs: int = typer.Option(256, "--max-num-seqs", min=1, help="Sequences in the running batch at most."),
    itl_target_ms: str = ITL_TARGET_MS,
    block_size: int = typer.Option(16, "--block-size", min=1, help="Tokens per KV-cache block."),
    kv_cache_memory: str = typer.Option(None, "--kv-cache-memory", help="KV budget per replica, e.g. 40GiB (default: 90% of the machine's memory less the weights; 2GiB with --calibrated, as serve)."),
    kv_bytes: str = typer.Option("2", "--kv-bytes", help="Bytes per KV-cache element, or a KV dtype: bf16 = 2, q8_0 = 1.0625 (int8 + an fp16 scale per 32)."),
    precision: str = typer.Option(None, "--precision", help="Matmul precision for the roofline (default: the machine's for the weights: int8 for quantised ones where measured)."),
    no_prefix_caching: bool = typer.Option(False, "--no-prefix-caching", help="Do not reuse KV blocks of shared prompt prefixes."),
    no_chunked_prefill: bool = typer.Option(False, "--no-chunked-prefill", help="Prefill each prompt whole in one step (it waits until it fits)."),
    replicas: int = typer.Option(1, "--replicas", min=1, help="Colocated engine replicas; requests go to the least loaded."),
    disaggregate: str = typer.Option(None, "--disaggregate", help="P:D prefill and decode replicas; KV crosses the link."),
    link_gb_s: float = typer.Option(50.0, "--link-gb-s", help="KV link bandwidth, GB/s (default 50: a 400 Gb/s NIC)."),
    link_latency_us: float = typer.Option(20.0, "--link-latency-us", help="KV link latency per transfer, microseconds."),
    calibrated: bool = typer.Option(False, "--calibrated", help="Step times from this machine's profile (`ridgeline profile`)."),
    profile: str = typer.Option(None, "--profile", help="Profile file (default: ~/.cache/ridgeline/profiles/MODEL.json)."),
    threads: int = typer.Option(None, "--threads", min=1, help="Threads the profile must have been measured with (default: torch's)."),
    slo_ttft_ms: float = typer.Option(None, "--slo-ttft-ms", help="Goodput SLO: time to first token, ms."),
    slo_itl_ms: float = typer.Option(None, "--slo-itl-ms", help="Goodput SLO: a request's mean inter-token latency, ms."),
    search: bool = typer.Option(False, "--search", help="Find the highest Poisson rate meeting the SLOs (and, with --target-rate, the smallest catalogue fleet)."),
    target_rate: float = typer.Option(None, "--target-rate", min=0, help="With --search: list the fewest machines of each catalogue type sustaining this rate."),
    usd_per_hour: float = typer.Option(None, "--usd-per-hour", min=0, help="Price a machine at this many US dollars an hour for $/Mtok (default: the catalogue's price for --hardware, or this machine's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    plot: str = typer.Option(None, "--plot", help="Write PREFIX-latency.png and PREFIX-throughput.png."),
) -> None:
    scheduler = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                enable_prefix_caching=not no_prefix_caching, enable_chunked_prefill=not no_chunked_prefill,
                                itl_target=None if no_chunked_prefill else parse_itl_target(itl_target_ms))
    from ridgeline.sim.metrics import summarise_run
    from ridgeline.sim.setup import SimOptions, deployment, parse_split
    from ridgeline.sim.simulator import simulate

    options = SimOptions(model, weights, hardware, precision, parse_kv_bytes(kv_bytes),
                         parse_bytes(kv_cache_memory) if kv_cache_memory else None, scheduler, block_size, replicas,
                         parse_split(disaggregate), Link(link_gb_s * 1e9, link_latency_us * 1e-6), calibrated, profile,
                         threads)
    deploy = dataclasses.replace(deployment(options), jitter_seed=seed)  # a calibrated model's jitter draws too
    warnings = deploy.step_time.warnings(scheduler.itl_target is not None) if calibrated else []
    for warning in warnings:  # on stderr, so --json stays one document
        Console(stderr=True).print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if usd_per_hour is None:
        price = price_of(hardware or THIS_MACHINE)
        usd_per_hour, price_source = price.usd_per_hour, price.source
    else:
        price_source = "--usd-per-hour"
    slo = Slo(slo_ttft_ms, slo_itl_ms)
    console = Console(stderr=as_json)
    common = dict(num_prompts=num_prompts, input_len=input_len, output_len=output_len,
                  shared_prefix_len=shared_prefix_len, max_concurrency=max_concurrency, seed=seed)
    config = {"model": deploy.shape.name, "weights": deploy.shape.weights, "step_time": deploy.step_time.name,
              "kv_pages": deploy.pool.num_pages, "kv_tokens": deploy.pool.tokens_of_all_layers,
              "scheduler": dataclasses.asdict(scheduler), "block_size": block_size, "replicas": replicas, "disaggregate": disaggregate,
              "slo": {"ttft_ms": slo_ttft_ms, "itl_ms": slo_itl_ms}, "workload": workload,
              "price": {"usd_per_hour": usd_per_hour, "source": price_source}, "warnings": warnings}
    if search:
        report = {"config": config, "search": run_search(options, deploy, slo, target_rate, common, usd_per_hour)}
        print(json.dumps(report, indent=2)) if as_json else print_search(console, report["search"])
        return
    levels = []
    for load in workloads(workload, deploy, model, **common):
        started = time.perf_counter()
        result = simulate(deploy, load)
        level = summarise_run(result, slo, load_of(load), deploy.shape.name, usd_per_hour)
        level["engine"]["wall_s"] = time.perf_counter() - started
        levels.append(level)
    report = {"config": config, "levels": levels}
    if plot:
        if any(level["load"]["request_rate"] is None and level["load"]["concurrency"] is None for level in levels):
            raise RidgelineError("--plot draws a sweep of rates or concurrencies, not a trace")
        report["plots"] = [str(p) for p in write_plots(report, plot)]
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console.print(f"step time: {deploy.step_time.name}; KV pool {deploy.pool.num_pages:,} pages "
                  f"({deploy.pool.tokens_of_all_layers:,} tokens of all layers) per replica", highlight=False)
    print_report(console, report, title=f"simulate: {deploy.shape.name} ({deploy.shape.weights})")
    for level in levels:
        console.print(f"{describe_load(level['load'])}: {describe_cost(level['cost'])}", highlight=False)
    console.print("simulated in " + ", ".join(f"{lv['engine']['wall_s']:.2f} s" for lv in levels), highlight=False)


def describe_load(load: dict) -> str:
    if load.get("request_rate") is not None:
        return f"rate {load['request_rate']:g}/s"
    return f"concurrency {load['concurrency']}" if load.get("concurrency") is not None else load.get("label") or "trace"


def describe_cost(cost: dict) -> str:
    def usd(value: float | None) -> str:
        return "-" if value is None else f"${value:,.3f}"

    return (f"{usd(cost['prompt_usd_per_mtok'])}/Mtok prompt, {usd(cost['completion_usd_per_mtok'])}/Mtok completion, "
            f"{usd(cost['blended_usd_per_mtok'])}/Mtok blended at ${cost['usd_per_hour']:,.3f}/h per machine "
            f"x {cost['machines']} ({cost['utilisation']:.0%} busy)")


def run_search(options: "SimOptions", deploy: "Deployment", slo: Slo, target_rate: float | None, common: dict,
               usd_per_hour: float) -> dict:
    from ridgeline.sim.metrics import summarise_run
    from ridgeline.sim.search import fleets, max_rate
    from ridgeline.sim.simulator import simulate

    vocab = deploy.shape.vocab_size

    def at(rate: float) -> Workload:
        return synthetic(common["num_prompts"], common["input_len"], common["output_len"], vocab, rate=rate,
                         concurrency=common["max_concurrency"], shared_prefix_len=common["shared_prefix_len"],
                         seed=common["seed"])

    found = {"max_rate": max_rate(deploy, at, slo)}
    if found["max_rate"] > 0:  # what a token costs at the busiest load that keeps the SLO: the cheapest it gets
        load = at(found["max_rate"])
        found["cost_at_max_rate"] = summarise_run(simulate(deploy, load), slo, load_of(load), deploy.shape.name,
                                                  usd_per_hour)["cost"]
    if target_rate:
        found["target_rate"] = target_rate
        found["fleets"] = fleets(options, at, slo, target_rate)
    return found


def print_search(console: Console, found: dict) -> None:
    console.print(f"highest sustained rate: {found['max_rate']:.3g} requests/s (90% of requests within the SLOs)")
    if "cost_at_max_rate" in found:
        console.print(f"at that rate: {describe_cost(found['cost_at_max_rate'])}", highlight=False)
    if "fleets" in found:
        if not found["fleets"]:
            console.print(f"no catalogue machine sustains {found['target_rate']:g} requests/s with up to 8 machines")
        for row in found["fleets"]:
            console.print(f"  {row['hardware']}: {row['machines']} machine(s), {row['layout']} "
                          f"({row['good_share']:.0%} within SLOs)"
                          + (f", ${row['usd_per_hour']:,.2f}/h" if row.get("usd_per_hour") is not None else ""),
                          highlight=False)
