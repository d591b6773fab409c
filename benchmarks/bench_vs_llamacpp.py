"""ridgeline vs llama.cpp, side by side in one run: pp512 and tg128 on the default model, with the ratios.

    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--threads 2] [--repetitions 3] [--rounds R] [--model PATH] [--peer P]
        [--json > benchmarks/results/bench_vs_llamacpp/bench_vs_llamacpp.json]

llama.cpp runs as its own `llama-bench` (the default peer; benchmarks/.llamacpp-tools, compiled on first use from
the same sdist as the reference outputs) or through llama-cpp-python in its own environment (--peer
llama-cpp-python; benchmarks/.venv-llamacpp). llama-bench times pp and tg its own way (tg from an empty cache,
like ours) with no Python around it: the stricter peer. The whole run holds /tmp/ridgeline-cpu.lock so no other
benchmark shares the CPUs.
Targets on the 2-core development machine: tg >= 1.0x llama.cpp, pp >= 0.8x.
"""

import argparse
import fcntl
import json
import statistics
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from llamacpp_env import CPU_LOCK, llamacpp_python
from llamacpp_tools import llama_bench

from ridgeline.bench.bench_latency import LatencyConfig, run_latency
from ridgeline.model.checkpoint import resolve_model_path

WORKER = Path(__file__).resolve().parent / "llamacpp_worker.py"
TARGETS = {"pp": 0.8, "tg": 1.3}  # issue 16: batch-1 tg at least 1.3x llama.cpp


def run_llamacpp(python: Path, model: Path, args: argparse.Namespace) -> dict:
    command = [python, WORKER, model, args.prompt_tokens, args.gen_tokens, args.threads, args.repetitions]
    done = subprocess.run([str(part) for part in command], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_llama_bench(binary: Path, model: Path, args: argparse.Namespace) -> dict:
    command = [binary, "-m", model, "-p", args.prompt_tokens, "-n", args.gen_tokens, "-t", args.threads,
               "-r", args.repetitions, "-o", "json"]
    done = subprocess.run([str(part) for part in command], check=True, capture_output=True, text=True)
    return llama_bench_rates(json.loads(done.stdout))


def llama_bench_rates(tests: list[dict]) -> dict:
    """pp/tg tok/s per repetition from llama-bench's JSON: one object per test, a pp test with n_gen 0 and a tg
    test with n_prompt 0, each with its repetitions' rates in samples_ts."""
    rates = {"pp_tok_s": [], "tg_tok_s": []}
    for test in tests:
        kind = "tg_tok_s" if test["n_gen"] else "pp_tok_s"
        rates[kind] += [float(rate) for rate in test["samples_ts"]]
    return {**rates, "llama_bench_build": tests[0].get("build_commit") if tests else None}


def mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):7.1f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:5.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled Gemma 3 270M Q4_K_M)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both engines")
    parser.add_argument("--repetitions", type=int, default=3, help="runs of each test")
    parser.add_argument("-p", "--prompt-tokens", type=int, default=512, help="pp prompt length")
    parser.add_argument("-n", "--gen-tokens", type=int, default=128, help="tg tokens")
    parser.add_argument("--peer", choices=("llama-bench", "llama-cpp-python"), default="llama-bench",
                        help="how llama.cpp runs: its own llama-bench, or llama-cpp-python")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of both engines, alternating which goes first; medians over rounds are reported")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    model = resolve_model_path(args.model)
    # built first if needed (each takes the CPU lock itself)
    peer = llama_bench() if args.peer == "llama-bench" else llamacpp_python()

    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        config = LatencyConfig(str(model), args.prompt_tokens, args.gen_tokens, args.threads, args.repetitions, ("quantized",))
        peer_run = run_llama_bench if args.peer == "llama-bench" else run_llamacpp
        rounds = []
        for index in range(args.rounds):
            # interleaved, A B then B A, so a slow minute on a shared machine lands on both engines alike
            for engine in (("ridgeline", "peer") if index % 2 == 0 else ("peer", "ridgeline")):
                if engine == "ridgeline":
                    ours = run_latency(config)[0]
                else:
                    theirs = peer_run(peer, model, args)
            # a round's figure is the median of its repetitions: one disturbed repetition does not move it
            rounds.append({"ridgeline": {"pp_tok_s": statistics.median(ours.pp_tok_s), "tg_tok_s": statistics.median(ours.tg_tok_s)},
                           "llama_cpp": {"pp_tok_s": statistics.median(theirs["pp_tok_s"]),
                                         "tg_tok_s": statistics.median(theirs["tg_tok_s"])}})

    rows = {
        "pp": (ours.pp_tok_s, theirs["pp_tok_s"]),
        "tg": (ours.tg_tok_s, theirs["tg_tok_s"]),
    }
    ratios = {phase: statistics.mean(a) / statistics.mean(b) for phase, (a, b) in rows.items()}
    # each engine's median over rounds, and their ratio: what the README's table shows
    medians = {side: {f"{phase}_tok_s": statistics.median(r[side][f"{phase}_tok_s"] for r in rounds) for phase in rows}
               for side in ("ridgeline", "llama_cpp")}
    median_ratios = {phase: medians["ridgeline"][f"{phase}_tok_s"] / medians["llama_cpp"][f"{phase}_tok_s"] for phase in rows}
    if args.json:
        # when and on what it ran, so the README's measured table can say so (benchmarks/readme_table.py)
        commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or None
        print(json.dumps({"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "ridgeline_commit": commit,
                          "model": model.name, "threads": args.threads, "peer": args.peer,
                          "repetitions": args.repetitions, "rounds": rounds, "median": medians,
                          "median_ratio": median_ratios, "ridgeline": ours.summary(), "llama_cpp": theirs,
                          "ratio": ratios}, indent=2))
        return
    if args.rounds > 1:
        for phase in rows:
            print(f"{phase}: median of {args.rounds} interleaved rounds {medians['ridgeline'][f'{phase}_tok_s']:.1f} vs "
                  f"{medians['llama_cpp'][f'{phase}_tok_s']:.1f} tok/s = {median_ratios[phase]:.2f}x; the last round:")
    names = {"pp": f"pp{args.prompt_tokens}", "tg": f"tg{args.gen_tokens}"}
    print(f"{model.name}, {args.threads} threads, {args.repetitions} runs each (tok/s, mean ± sd)")
    print(f"{'test':8} {'ridgeline':>15} {args.peer:>15} {'ratio':>7} {'target':>7}")
    for phase, (a, b) in rows.items():
        verdict = "met" if ratios[phase] >= TARGETS[phase] else "missed"
        print(f"{names[phase]:8} {mean_sd(a):>15} {mean_sd(b):>15} {ratios[phase]:6.2f}x {TARGETS[phase]:5.1f}x {verdict}")
    print(f"ridgeline tg = {ours.tg_fraction_of_ceiling:.0%} of the napkin ceiling "
          f"({ours.read_bandwidth / 1e9:.1f} GB/s / {ours.bytes_per_token / 1e6:.1f} MB per token = {ours.ceiling_tok_s:.0f} tok/s)")


if __name__ == "__main__":
    main()
