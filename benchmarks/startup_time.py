"""Seconds from launching `ridgeline serve` to its first 200 on /health: a cold start (empty cache folder: the
GGUF index is parsed and weights are packed, then both are cached) and warm starts after it.

    python benchmarks/startup_time.py [--warm-runs 2] [--model PATH] [--threads 2]

Each run is a fresh process on a free port; the server's own one-line breakdown of its start-up is printed
beside the measured time. The cache folder is a temporary one (RIDGELINE_CACHE_DIR), so the machine's real
cache is left alone; where the kernels compile, the cold run includes their ~30 s build.
"""

import argparse
import subprocess
import tempfile
import time

from ridgeline.bench.served import ridgeline_server


def time_to_health(cache_dir: str, model: str | None, threads: int) -> tuple[float, str]:
    """Seconds to the first 200 on /health, and the server's own start-up line."""
    start = time.perf_counter()
    args = ["--threads", str(threads), *([model] if model else [])]
    with ridgeline_server(*args, env={"RIDGELINE_CACHE_DIR": cache_dir}, stderr=subprocess.PIPE) as (_, server):
        seconds = time.perf_counter() - start
        # The line is printed before the server binds its port, so it has arrived by now.
        line = next((line.strip() for line in server.stderr if line.startswith("start-up")), "")
    return seconds, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm-runs", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ridgeline-cache-") as cache_dir:
        for run in range(1 + args.warm_runs):
            seconds, line = time_to_health(cache_dir, args.model, args.threads)
            print(f"{'cold' if run == 0 else 'warm'}: {seconds:6.2f} s to /health   ({line})", flush=True)


if __name__ == "__main__":
    main()
