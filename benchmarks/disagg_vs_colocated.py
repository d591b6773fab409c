"""Disaggregated vs colocated serving, DistServe-style, side by side in one run on this machine.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/disagg_vs_colocated.py [--duration 60] [--json out.json]

The load the seeds describe: --streams requests decoding (short prompts, long outputs) while --long-prompt-token
prompts arrive as a Poisson process (--long-rate per second). Settings, each on fresh servers:
  colocated, chunked prefill at each --budgets token budget, and unchunked (one server, --threads 2);
  disaggregated: a prefill worker pinned to core 0 and a decode worker pinned to core 1 (--threads 1 each),
  behind `ridgeline proxy` (every prompt prefilled remotely).
Reported per setting: the streams' ITL p50/p99 (target for disaggregated: p99 <= 1.3x p50), the long prompts'
TTFT (transfer included), output tokens/s, and goodput (requests/s meeting both --slo-ttft-ms and --slo-itl-ms).
"""

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time

import httpx
import numpy as np

from ridgeline.bench.bench_serve import FILLER_WORDS, BenchServeConfig, Prompt, send_request
from ridgeline.bench.serve_metrics import Slo, summarise


def start(args: list[str], cores: str | None = None) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-c", "from ridgeline.cli import main; main()", *args, "--port", "0"]
    if cores is not None:
        command = ["taskset", "-c", cores, *command]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        if match := re.search(r"Uvicorn running on (http://[\d.]+:\d+)", line):
            # Keep draining stderr so the server never blocks on a full pipe.
            subprocess.Popen(["cat"], stdin=process.stderr, stdout=subprocess.DEVNULL)
            return process, match.group(1)
    process.kill()
    raise RuntimeError(f"{' '.join(args)} did not start")


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(count))


async def run_load(url: str, args: argparse.Namespace) -> dict:
    rng = random.Random(0)
    config = BenchServeConfig(base_url=url)
    slo = Slo(ttft_ms=args.slo_ttft_ms, itl_ms=args.slo_itl_ms)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(args.duration * 4)) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        streams = [asyncio.create_task(send_request(client, config, model, Prompt(words(48, rng), args.stream_tokens)))
                   for _ in range(args.streams)]
        await asyncio.sleep(2.0)  # the streams are decoding before the first long prompt comes
        started, longs = time.perf_counter(), []
        while (elapsed := time.perf_counter() - started) < args.duration:
            longs.append(asyncio.create_task(send_request(client, config, model,
                                                          Prompt(words(args.long_prompt_tokens, rng), args.long_output))))
            await asyncio.sleep(rng.expovariate(args.long_rate))
        stream_results = await asyncio.gather(*streams)
        long_results = await asyncio.gather(*longs)
        duration = time.perf_counter() - started + 2.0
    itls = [gap for r in stream_results if r.ok for gap in r.itls_s]
    everything = summarise(list(stream_results) + list(long_results), duration, slo)
    return {
        "stream_itl_p50_ms": float(np.percentile(itls, 50) * 1e3), "stream_itl_p99_ms": float(np.percentile(itls, 99) * 1e3),
        "long_ttft_p50_ms": summarise(long_results, duration, slo)["ttft_ms"]["p50"],
        "long_ttft_p99_ms": summarise(long_results, duration, slo)["ttft_ms"]["p99"],
        "output_tokens_per_s": everything["output_tokens_per_s"], "goodput_rps": everything["goodput"],
        "failed": everything["failed"], "long_prompts": len(long_results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--budgets", default="64,256", help="chunk budgets of the colocated runs")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=400, help="each stream's output (long enough to span the run)")
    parser.add_argument("--long-prompt-tokens", type=int, default=2000)
    parser.add_argument("--long-output", type=int, default=16)
    parser.add_argument("--long-rate", type=float, default=0.1, help="long prompts per second (Poisson)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of long-prompt arrivals per setting")
    parser.add_argument("--slo-ttft-ms", type=float, default=15000.0)
    parser.add_argument("--slo-itl-ms", type=float, default=200.0)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    model = [args.model] if args.model else []
    common = ["--kv-cache-memory", "1GiB"]
    settings: dict[str, dict] = {}
    for budget in [int(b) for b in args.budgets.split(",")] + [None]:
        name = f"colocated, chunked at {budget}" if budget else "colocated, unchunked"
        extra = ["--max-num-batched-tokens", str(budget)] if budget else ["--max-num-batched-tokens", "4096"]
        process, url = start(["serve", *model, "--threads", "2", *common, *extra])
        try:
            settings[name] = asyncio.run(run_load(url, args))
        finally:
            process.kill()
        print(name, settings[name], flush=True)
    prefill, prefill_url = start(["serve", *model, "--threads", "1", "--role", "prefill", *common,
                                  "--max-num-batched-tokens", "4096"], cores="0")
    decode, decode_url = start(["serve", *model, "--threads", "1", "--role", "decode", *common,
                                "--max-num-batched-tokens", "256"], cores="1")
    proxy, proxy_url = start(["proxy", "--prefill", prefill_url, "--decode", decode_url, "--local-prefill-tokens", "1"],
                             cores="1")
    try:
        settings["disaggregated, 1 core prefill : 1 core decode"] = asyncio.run(run_load(proxy_url, args))
    finally:
        for process in (proxy, prefill, decode):
            process.kill()
    print("| setting | stream ITL p50 ms | p99 ms | p99/p50 | long TTFT p50 ms | p99 ms | output tok/s | goodput req/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in settings.items():
        print(f"| {name} | {r['stream_itl_p50_ms']:.1f} | {r['stream_itl_p99_ms']:.1f} | "
              f"{r['stream_itl_p99_ms'] / r['stream_itl_p50_ms']:.2f} | {r['long_ttft_p50_ms']:.0f} | "
              f"{r['long_ttft_p99_ms']:.0f} | {r['output_tokens_per_s']:.1f} | {r['goodput_rps']:.3f} |")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"args": vars(args), "settings": settings}, file, indent=2)


if __name__ == "__main__":
    main()
