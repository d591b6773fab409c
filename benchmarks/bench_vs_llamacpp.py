"""ridgeline vs llama.cpp, side by side in one run: pp512 and tg128 on the default model, with the ratios.

    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--threads 2] [--repetitions 3] [--model PATH]

llama.cpp runs through llama-cpp-python in its own environment (benchmarks/.venv-llamacpp, built on first use:
it compiles llama.cpp). The whole run holds /tmp/ridgeline-cpu.lock so no other benchmark shares the CPUs.
Targets on the 2-core development machine: tg >= 1.0x llama.cpp, pp >= 0.8x.
"""

import argparse
import fcntl
import json
import statistics
import subprocess
from pathlib import Path

from llamacpp_env import CPU_LOCK, llamacpp_python

from ridgeline.bench.bench_latency import LatencyConfig, run_latency
from ridgeline.model.checkpoint import resolve_model_path

WORKER = Path(__file__).resolve().parent / "llamacpp_worker.py"
TARGETS = {"pp": 0.8, "tg": 1.0}


def run_llamacpp(python: Path, model: Path, args: argparse.Namespace) -> dict:
    command = [python, WORKER, model, args.prompt_tokens, args.gen_tokens, args.threads, args.repetitions]
    done = subprocess.run([str(part) for part in command], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):7.1f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:5.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled Gemma 3 270M Q4_K_M)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both engines")
    parser.add_argument("--repetitions", type=int, default=3, help="runs of each test")
    parser.add_argument("-p", "--prompt-tokens", type=int, default=512, help="pp prompt length")
    parser.add_argument("-n", "--gen-tokens", type=int, default=128, help="tg tokens")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    model = resolve_model_path(args.model)
    python = llamacpp_python()  # builds the environment first if needed (takes the CPU lock itself)

    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        config = LatencyConfig(str(model), args.prompt_tokens, args.gen_tokens, args.threads, args.repetitions, ("quantized",))
        ours = run_latency(config)[0]
        theirs = run_llamacpp(python, model, args)

    rows = {
        "pp": (ours.pp_tok_s, theirs["pp_tok_s"]),
        "tg": (ours.tg_tok_s, theirs["tg_tok_s"]),
    }
    ratios = {phase: statistics.mean(a) / statistics.mean(b) for phase, (a, b) in rows.items()}
    if args.json:
        print(json.dumps({"ridgeline": ours.summary(), "llama_cpp": theirs, "ratio": ratios}, indent=2))
        return
    names = {"pp": f"pp{args.prompt_tokens}", "tg": f"tg{args.gen_tokens}"}
    print(f"{model.name}, {args.threads} threads, {args.repetitions} runs each (tok/s, mean ± sd)")
    print(f"{'test':8} {'ridgeline':>15} {'llama.cpp':>15} {'ratio':>7} {'target':>7}")
    for phase, (a, b) in rows.items():
        verdict = "met" if ratios[phase] >= TARGETS[phase] else "missed"
        print(f"{names[phase]:8} {mean_sd(a):>15} {mean_sd(b):>15} {ratios[phase]:6.2f}x {TARGETS[phase]:5.1f}x {verdict}")
    print(f"ridgeline tg = {ours.tg_fraction_of_ceiling:.0%} of the napkin ceiling "
          f"({ours.read_bandwidth / 1e9:.1f} GB/s / {ours.bytes_per_token / 1e6:.1f} MB per token = {ours.ceiling_tok_s:.0f} tok/s)")


if __name__ == "__main__":
    main()
