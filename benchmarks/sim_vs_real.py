"""Validate `ridgeline simulate --calibrated` against the real server on this machine.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/sim_vs_real.py [--requests 24] [--threads 2]

1. `ridgeline profile` measures this machine's engine steps (skipped with --profile FILE).
2. Writes one trace per load level (benchmarks/out/sim_vs_real/): Poisson arrivals at 5 rates and all-at-once
   arrivals for 3 concurrencies; prompts of token ids, a mix of short and long (up to 1,536 tokens), half of
   them opening with one shared 256-token prefix (so the prefix cache is exercised), 16-64 output tokens.
3. Replays each trace through `bench serve` against `ridgeline serve` (default model, --threads, loopback),
   recording what each request measured, and through the simulator with the calibrated step time.
4. Prints the absolute % error per metric (TTFT p50/p90/p99, ITL p50/p99, output throughput) and level,
   writes docs/sim_validation.png (measured vs simulated) and benchmarks/out/sim_vs_real/results.json.

Target (issue 14): median error <= 8% over all metrics and levels, and no TTFT p90 error above 20%.
"""

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from statistics import median

from served import ridgeline_server


from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.model.checkpoint import read_checkpoint
from ridgeline.bench.bench_serve import BenchServeConfig, LoadLevel, bench_serve
from ridgeline.bench.serve_metrics import Slo
from ridgeline.sim.metrics import summarise_run
from ridgeline.sim.setup import SimOptions, deployment
from ridgeline.sim.simulator import simulate
from ridgeline.sim.trace import TraceRequest, read_trace, write_trace
from ridgeline.sim.workload import FIRST_PLAIN_ID, from_trace, poisson_arrivals

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out" / "sim_vs_real"
METRICS = (("ttft_ms", "p50"), ("ttft_ms", "p90"), ("ttft_ms", "p99"), ("itl_ms", "p50"), ("itl_ms", "p99"),
           ("output_tokens_per_s", None))
PROMPT_LENGTHS = (48, 200, 600, 1536)
OUTPUT_LENGTHS = (16, 32, 64)
SHARED_PREFIX = 256


def make_trace(path: Path, count: int, vocab: int, rate: float | None, seed: int) -> Path:
    rng = random.Random(seed)
    prefix = [rng.randrange(FIRST_PLAIN_ID, vocab) for _ in range(SHARED_PREFIX)]
    arrivals = poisson_arrivals(rate, count, seed) if rate else [0.0] * count
    rows = []
    for arrival in arrivals:
        length = rng.choice(PROMPT_LENGTHS)
        head = prefix if rng.random() < 0.5 and length > SHARED_PREFIX else []
        ids = head + [rng.randrange(FIRST_PLAIN_ID, vocab) for _ in range(length - len(head))]
        rows.append(TraceRequest(arrival, rng.choice(OUTPUT_LENGTHS), prompt_ids=tuple(ids)))
    return write_trace(path, rows)


def value(level: dict, metric: str, stat: str | None) -> float:
    return level[metric] if stat is None else level[metric][stat]


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 7.5))
    for ax, (metric, stat) in zip(axes.flat, METRICS):
        name = f"{metric} {stat}" if stat else metric
        real = [r["measured"][name] for r in rows]
        sim = [r["simulated"][name] for r in rows]
        ax.scatter(real, sim, s=18)
        for r, x, y in zip(rows, real, sim):
            ax.annotate(r["level"], (x, y), fontsize=6)
        low, high = min(real + sim) * 0.8, max(real + sim) * 1.25
        ax.plot([low, high], [low, high], color="grey", lw=0.8)
        ax.set(xscale="log", yscale="log", title=name, xlabel="measured (ridgeline serve)", ylabel="simulated")
    fig.suptitle("ridgeline simulate --calibrated vs ridgeline serve, same traces (this machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24, help="requests per load level")
    parser.add_argument("--rates", default="0.3,0.6,0.9,1.2,1.5", help="Poisson rates (requests/s)")
    parser.add_argument("--concurrencies", default="1,4,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", type=Path, help="use this profile instead of measuring one")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    python = [sys.executable, "-c", "from ridgeline.cli import main; main()"]
    profile = args.profile or OUT / "profile.json"
    if args.profile is None:
        subprocess.run([*python, "profile", "--threads", str(args.threads), "--out", str(profile)], check=True)

    vocab = read_checkpoint(None).config.vocab_size
    levels = [(f"rate {r}", float(r), None) for r in args.rates.split(",")]
    levels += [(f"conc {c}", None, int(c)) for c in args.concurrencies.split(",")]
    traces = {label: make_trace(OUT / f"trace-{label.replace(' ', '-')}.jsonl", args.requests, vocab, rate, seed=i)
              for i, (label, rate, _) in enumerate(levels)}

    measured = {}
    with open(OUT / "serve.log", "w") as log, ridgeline_server("--threads", str(args.threads), stderr=log) as (url, _):
        warm = make_trace(OUT / "warm-up.jsonl", 4, vocab, None, seed=99)
        bench_serve(BenchServeConfig(url, trace=warm), [LoadLevel(concurrency=2)])
        for label, _, concurrency in levels:
            print(f"measuring {label}", flush=True)
            record = OUT / f"recorded-{label.replace(' ', '-')}.jsonl"
            config = BenchServeConfig(url, trace=traces[label], record=record, max_seconds=600)
            measured[label] = bench_serve(config, [LoadLevel(concurrency=concurrency)])["levels"][0]

    options = SimOptions(calibrated=True, profile=str(profile), threads=args.threads, scheduler=SchedulerConfig())
    deploy = deployment(options)
    rows = []
    for label, _, concurrency in levels:
        workload = from_trace(read_trace(traces[label]), deploy.shape.vocab_size, concurrency=concurrency)
        simulated = summarise_run(simulate(deploy, workload), Slo(), {}, deploy.shape.name)
        row = {"level": label, "measured": {}, "simulated": {}, "error_pct": {}}
        for metric, stat in METRICS:
            name = f"{metric} {stat}" if stat else metric
            real, sim = value(measured[label], metric, stat), value(simulated, metric, stat)
            row["measured"][name], row["simulated"][name] = real, sim
            row["error_pct"][name] = abs(sim - real) / real * 100
        rows.append(row)

    names = [f"{m} {s}" if s else m for m, s in METRICS]
    print("\nabsolute % error, simulated vs measured")
    print("| level | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for row in rows:
        print(f"| {row['level']} | " + " | ".join(f"{row['error_pct'][n]:.1f}" for n in names) + " |")
    errors = [row["error_pct"][n] for row in rows for n in names]
    ttft_p90 = [row["error_pct"]["ttft_ms p90"] for row in rows]
    summary = {"median_error_pct": median(errors), "max_ttft_p90_error_pct": max(ttft_p90),
               "per_metric_median_pct": {n: median(row["error_pct"][n] for row in rows) for n in names}}
    print(f"\nmedian error {summary['median_error_pct']:.1f}% (target <= 8%); "
          f"worst TTFT p90 error {summary['max_ttft_p90_error_pct']:.1f}% (target <= 20%)")
    print("per metric (median over levels): " + ", ".join(f"{n} {v:.1f}%" for n, v in summary["per_metric_median_pct"].items()))
    (OUT / "results.json").write_text(json.dumps({"summary": summary, "rows": rows, "step_time": deploy.step_time.name}, indent=2))
    print(f"wrote {plot(rows, ROOT / 'docs' / 'sim_validation.png')}")


if __name__ == "__main__":
    main()
