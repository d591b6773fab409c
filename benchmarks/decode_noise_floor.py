"""The spread of an unchanging decode step on one core, with the machine's other core idle, copying memory, or
computing: the floor under any ITL tail measured on this machine.

The disaggregated benchmark (disagg_vs_colocated.py) gives the decode worker one core and the prefill worker the
other. Its decode steps spread ~1.8x (p99/p50) in CPU time, not only in wall time, so the work itself slows. This
runs the same kind of step -- 8 short rows, one thread, nothing else in the process -- to see how much of that
spread the machine adds with none of ridgeline's load beside it. Run it under the CPU lock:

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/decode_noise_floor.py --json benchmarks/results/decode_noise_floor/decode_noise_floor.json
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time

import numpy as np

NEIGHBOURS = {
    "idle": None,
    # memory-bound: a 64 MiB copy, over and over (it stalls on DRAM and leaves the core's execution units alone)
    "memory": "import numpy as np, time\na = np.ones(8 << 20); b = np.empty_like(a)\nwhile True: np.copyto(b, a)",
    # compute-bound: a dependent floating-point chain in registers
    "compute": "x = 1.0\nwhile True:\n    for _ in range(100000): x = x * 1.0000001 + 1e-9",
}


def measure(steps: int, rows: int) -> dict:
    from ridgeline.engine.options import engine_config
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.engine.sampling_params import SamplingParams

    engine = LLMEngine(engine_config(None, threads=1))
    rng = random.Random(0)
    for i in range(rows):
        engine.add_request(f"r{i}", [rng.randrange(1000, 20000) for _ in range(40)],
                           SamplingParams(max_tokens=steps + 20, ignore_eos=True, temperature=0))
    for _ in range(10):  # the prompts and the first decodes: not what is measured
        engine.step()
    wall, cpu = [], []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.thread_time()
        engine.step()
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - cpu_started)
    return {"wall_ms": summary(wall), "cpu_ms": summary(cpu)}


def measure_fixed_work(steps: int, loop_ms: float) -> dict:
    """The same count of timed pieces of a fixed arithmetic loop (no memory traffic, no allocation, no torch), as
    long as a decode step: whatever spreads here is the machine, not the step."""
    def work(n: int) -> float:
        x = 1.0
        for _ in range(n):
            x = x * 1.0000001 + 1e-9
        return x

    calibration = time.thread_time()
    work(200_000)
    per_iteration = (time.thread_time() - calibration) / 200_000
    n = max(1, int(loop_ms / 1e3 / per_iteration))
    wall, cpu = [], []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.thread_time()
        work(n)
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - cpu_started)
    return {"wall_ms": summary(wall), "cpu_ms": summary(cpu)}


def summary(seconds: list[float]) -> dict:
    ms = np.array(seconds) * 1e3
    p50, p99 = np.percentile(ms, 50), np.percentile(ms, 99)
    return {"p50": float(p50), "p90": float(np.percentile(ms, 90)), "p99": float(p99), "p99_over_p50": float(p99 / p50)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--core", type=int, default=1, help="the core the steps run on; the neighbour gets the other")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # measure here, print JSON
    parser.add_argument("--fixed-work-ms", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.steps, args.rows) if args.fixed_work_ms is None
                         else measure_fixed_work(args.steps, args.fixed_work_ms)))
        return
    other = 1 - args.core
    results = {}
    runs = [(name, code, False) for name, code in NEIGHBOURS.items()]
    runs.append(("idle, fixed arithmetic instead of decode steps", None, True))
    for name, code, fixed_work in runs:
        # the fixed loop runs as long as the idle neighbour's median decode step
        extra = ["--fixed-work-ms", str(results["idle"]["cpu_ms"]["p50"])] if fixed_work else []
        neighbour = None if code is None else subprocess.Popen(["taskset", "-c", str(other), sys.executable, "-c", code])
        try:
            done = subprocess.run(["taskset", "-c", str(args.core), sys.executable, __file__, "--worker",
                                   "--steps", str(args.steps), "--rows", str(args.rows), *extra],
                                  capture_output=True, text=True, check=True)
        finally:
            if neighbour is not None:
                neighbour.kill()
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        wall, cpu = results[name]["wall_ms"], results[name]["cpu_ms"]
        print(f"other core {name}: wall p50 {wall['p50']:5.1f} p99 {wall['p99']:5.1f} ({wall['p99_over_p50']:.2f}x)"
              f"  cpu p50 {cpu['p50']:5.1f} p99 {cpu['p99']:5.1f} ({cpu['p99_over_p50']:.2f}x)", flush=True)
    if args.json:
        stamp = {"utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "rows": args.rows, "steps": args.steps,
                 "cpus": os.cpu_count()}
        with open(args.json, "w") as out:
            json.dump({"run": stamp, "neighbours": results}, out, indent=2)


if __name__ == "__main__":
    main()
