"""How fast the simulator itself runs: 10,000 requests through the real scheduler on a virtual clock.

    .venv/bin/python benchmarks/sim_speed.py [--requests 10000] [--input-len 512] [--output-len 128] [--profile]

Llama-3.1-8B BF16 on one H100 (roofline step time), Poisson arrivals at --rate, 256-token shared prefix on
every prompt. Prints wall seconds, simulated seconds, steps and scheduled tokens per wall second; --profile
adds the loop's top functions by own time (cProfile). Target (issue 14): 10,000 requests well under a minute.
"""

import argparse
import cProfile
import pstats
import time

from ridgeline.workload.serve_metrics import Slo
from ridgeline.sim.metrics import summarise_run
from ridgeline.sim.setup import SimOptions, deployment
from ridgeline.sim.simulator import simulate
from ridgeline.sim.workload import synthetic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    deploy = deployment(SimOptions("llama-3.1-8b", "BF16", "nvidia-h100-sxm"))
    workload = synthetic(args.requests, args.input_len, args.output_len, deploy.shape.vocab_size, rate=args.rate,
                         shared_prefix_len=min(256, args.input_len))
    profiler = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    result = simulate(deploy, workload)
    if profiler:
        profiler.disable()
    wall = time.perf_counter() - start
    level = summarise_run(result, Slo(), {}, deploy.shape.name)
    engine = level["engine"]
    tokens = sum(r.stats.tokens_computed for r in result.replicas)
    print(f"{args.requests:,} requests ({args.input_len} + {args.output_len} tokens, {args.rate:g}/s): "
          f"{wall:.1f} s wall for {result.duration_s:,.0f} s simulated; {engine['steps']:,} steps "
          f"({engine['steps'] / wall:,.0f}/s), {tokens / wall:,.0f} scheduled tokens/s, "
          f"mean running batch {engine['running_batch_mean']:.0f}; completed {level['completed']:,}")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
