#!/usr/bin/env python
"""Long API fuzzing run: schemathesis over a tiny random model's server (or any running ridgeline server),
every endpoint, valid and invalid requests. Prints requests tried, statuses, and each failure.

    python scripts/fuzz_api.py [--examples 500] [--seed 1] [--base-url URL] [--max-tokens 16] [--max-n 4]

Without --base-url it starts the tiny model's server in this process and, at the end, checks /health and
that /metrics shows every KV page free. Exit status 1 if anything failed.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import httpx  # noqa: E402
from fuzz.api_fuzz import fuzz_api  # noqa: E402
from server_helpers import serve_tiny_model  # noqa: E402
from test_api_fuzz import kv_pages  # noqa: E402


def run(base_url: str, args) -> bool:
    report = fuzz_api(base_url, args.examples, args.seed, args.max_tokens, args.max_n)
    print(f"{report.requests} requests; statuses {dict(sorted(report.by_status.items()))}; {len(report.failures)} failures")
    for failure in report.failures:
        print("FAIL", failure)
    healthy = httpx.get(f"{base_url}/health").status_code == 200
    free, total = kv_pages(base_url)
    print(f"healthy after: {healthy}; KV pages free {free:.0f} of {total:.0f}")
    return not report.failures and healthy and free == total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500, help="per endpoint and mode (valid / invalid)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--base-url")
    parser.add_argument("--max-tokens", type=int, default=16, help="cap on max_tokens of generated valid requests")
    parser.add_argument("--max-n", type=int, default=4)
    args = parser.parse_args()
    if args.base_url:
        ok = run(args.base_url, args)
    else:
        with serve_tiny_model(num_blocks=64) as server:
            ok = run(server.url, args)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
