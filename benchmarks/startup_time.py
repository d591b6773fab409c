"""Seconds from launching a server to its first 200 on /health, on the default model: `ridgeline serve` warm (kernels
built, weights packed, page cache warm) and cold (an empty cache folder: the kernels are compiled, the GGUF index
parsed and the weights packed), beside llama-server started the same way, in one run.

    python benchmarks/startup_time.py [--rounds 5] [--threads 2] [--cold] [--baseline-src OTHER/src] [--out DIR]

Warm ridgeline and llama-server alternate (A B, B A, ...) and each figure is the median of its rounds. Each ridgeline
start prints its own breakdown (startup_clock.py), kept beside its time. `--baseline-src` times another ridgeline
source tree as well, with an empty this-machine cache (as after a start with another --threads evicted the one
entry older versions kept), to show what measuring at start-up cost. The ridgeline cache folder of the cold run is a
temporary one (RIDGELINE_CACHE_DIR); the warm runs use the machine's. `--out DIR` writes the figures as JSON there.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llamacpp_env import CPU_LOCK
from llamacpp_tools import TOOLS_DIR

from ridgeline.bench.served import free_port, ridgeline_server, wait_for_health
from ridgeline.machine.cpu import cpu_model
from ridgeline.model.default_model import default_model_path


def time_ridgeline(threads: int, env: dict[str, str]) -> tuple[float, str]:
    """Seconds to the first 200 on /health, and the server's own start-up line."""
    start = time.perf_counter()
    with ridgeline_server("--threads", str(threads), env=env, stderr=subprocess.PIPE) as (_, server):
        seconds = time.perf_counter() - start
    # The line is printed before the server binds its port; the rest of stderr is read once it has stopped.
    line = next((line.strip() for line in server.stderr if line.startswith("start-up")), "")
    return seconds, line


def time_llama_server(binary: Path, model: Path, threads: int) -> float:
    port = free_port()
    start = time.perf_counter()
    server = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                               "-t", str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_health(server, f"http://127.0.0.1:{port}")  # llama-server answers 503 until its model is loaded
        return time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(timeout=60)


def git_commit() -> str:
    result = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="one cold ridgeline start too (compiles the kernels)")
    parser.add_argument("--llama-server", type=Path, default=TOOLS_DIR / "bin" / "llama-server",
                        help="llama-server binary (benchmarks/llamacpp_tools.py builds it)")
    parser.add_argument("--baseline-src", type=Path, help="another ridgeline src/ to time, with an empty machine cache")
    parser.add_argument("--out", type=Path, help="folder to write startup_time.json into")
    args = parser.parse_args()
    model = default_model_path()
    here = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    have_llama = args.llama_server.exists()
    if not have_llama:
        print(f"no llama-server at {args.llama_server}: ridgeline alone (python benchmarks/llamacpp_tools.py builds it)")
    times: dict[str, list[float]] = {"ridgeline warm": []}
    breakdown: dict[str, list[str]] = {"ridgeline warm": []}
    if have_llama:
        times["llama-server"] = []
    if args.baseline_src:
        times["baseline, empty machine cache"], breakdown["baseline, empty machine cache"] = [], []

    with open(CPU_LOCK, "a") as lock, tempfile.TemporaryDirectory(prefix="ridgeline-startup-") as scratch:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)
        time_ridgeline(args.threads, here)  # one unrecorded start: the page cache holds the model and the packed weights
        if have_llama:
            time_llama_server(args.llama_server, model, args.threads)
        for round_ in range(args.rounds):
            order = ["ridgeline warm", "llama-server"] if have_llama else ["ridgeline warm"]
            if round_ % 2:
                order.reverse()
            if args.baseline_src:
                order.append("baseline, empty machine cache")
            for name in order:
                if name == "llama-server":
                    seconds, line = time_llama_server(args.llama_server, model, args.threads), ""
                elif name == "ridgeline warm":
                    seconds, line = time_ridgeline(args.threads, here)
                else:
                    empty = Path(scratch) / f"xdg-{round_}"
                    empty.mkdir()
                    seconds, line = time_ridgeline(args.threads, {"PYTHONPATH": str(args.baseline_src.resolve()),
                                                                  "XDG_CACHE_HOME": str(empty)})
                times[name].append(seconds)
                if line:
                    breakdown[name].append(line)
                print(f"round {round_}: {name}: {seconds:.2f} s  {line}", flush=True)
        if args.cold:
            cold_cache = Path(scratch) / "cache"
            seconds, line = time_ridgeline(args.threads, here | {"RIDGELINE_CACHE_DIR": str(cold_cache)})
            times["ridgeline cold"], breakdown["ridgeline cold"] = [seconds], [line]
            print(f"cold: {seconds:.2f} s  {line}", flush=True)
            shutil.rmtree(cold_cache, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in times.items() if values}
    print("\nmedian seconds to the first 200 on /health:")
    for name, value in medians.items():
        spread = f" (range {min(times[name]):.2f}-{max(times[name]):.2f}, {len(times[name])} runs)"
        print(f"  {name:32s} {value:6.2f} s{spread if len(times[name]) > 1 else ''}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {
            "benchmark": "startup_time", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": git_commit(), "cpu": cpu_model(), "host": platform.node(), "cpus": os.cpu_count(),
            "threads": args.threads, "model": str(model), "rounds": args.rounds, "command": " ".join(sys.argv),
            "seconds_to_health": times, "median_s": medians, "ridgeline_breakdown": breakdown,
        }
        (args.out / "startup_time.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out / 'startup_time.json'}")


if __name__ == "__main__":
    main()
