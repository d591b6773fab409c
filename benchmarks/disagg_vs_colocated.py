"""Disaggregated vs colocated serving, DistServe-style, on this machine.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/disagg_vs_colocated.py --json out.json [--settings ...]

The load the seeds describe: --streams requests decoding all the time (closed loop: a stream that finishes is
replaced by the next, short prompt, --stream-tokens of output) while --long-prompt-tokens prompts arrive as a
Poisson process (--long-rate per second, for --duration seconds; the arrival times and every prompt are drawn
from fixed seeds, so each setting gets exactly the same load). The streams keep going until the last long prompt
has its answer. Settings, each on fresh servers:
  chunked-B: colocated, chunked prefill at a token budget of B per step (one server, --threads 2);
  unchunked: colocated, one step takes a whole prompt;
  disaggregated: a prefill worker pinned to core 0 and a decode worker pinned to core 1 (--threads 1 each),
  behind `ridgeline proxy` (every prompt prefilled remotely).
Reported per setting: the streams' ITL p50/p99 (target for disaggregated: p99 <= 1.3x p50), the long prompts'
TTFT (transfer included), output tokens/s, and goodput (requests/s meeting both --slo-ttft-ms and --slo-itl-ms).

--settings runs some of them; with --json, results are added to the file's (which must hold the same load), so a
long comparison can run as one invocation per setting and still print one table.
"""

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from ridgeline.bench.bench_serve import FILLER_WORDS, BenchServeConfig, Prompt, send_request
from ridgeline.workload.serve_metrics import Slo, summarise

LOAD_ARGS = ("model", "streams", "stream_tokens", "long_prompt_tokens", "long_output", "long_rate", "duration",
             "slo_ttft_ms", "slo_itl_ms")


LOG_DIR = Path("/tmp/disagg-logs")  # each server's stderr, kept: a failed request's cause is in its workers' logs


def start(args: list[str], cores: str | None = None, log_name: str = "server",
          env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-c", "from ridgeline.cli import main; main()", *args, "--port", "0"]
    if cores is not None:
        command = ["taskset", "-c", cores, *command]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=None if env is None else {**os.environ, **env})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        if match := re.search(r"Uvicorn running on (http://[\d.]+:\d+)", line):
            # Keep draining stderr so the server never blocks on a full pipe, into a log of its own.
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            with open(LOG_DIR / f"{log_name}.log", "w") as log:
                subprocess.Popen(["cat"], stdin=process.stderr, stdout=log)
            return process, match.group(1)
    process.kill()
    raise RuntimeError(f"{' '.join(args)} did not start")


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(count))


def long_prompts(args: argparse.Namespace) -> list[tuple[float, str]]:
    """(arrival second, prompt) of every long prompt: the same for every setting."""
    rng, arrivals, at = random.Random(0), [], 0.0
    while at < args.duration:
        arrivals.append((at, words(args.long_prompt_tokens, rng)))
        at += rng.expovariate(args.long_rate)
    return arrivals


async def run_load(url: str, args: argparse.Namespace) -> dict:
    config = BenchServeConfig(base_url=url)
    slo = Slo(ttft_ms=args.slo_ttft_ms, itl_ms=args.slo_itl_ms)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0)) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        longs_done = asyncio.Event()

        async def timed(prompt: Prompt):
            """(when it was sent, its result): chunk times are relative to the send."""
            sent = time.perf_counter()
            return sent, await send_request(client, config, model, prompt)

        async def stream(index: int) -> list:
            rng, results = random.Random(1000 + index), []
            while not longs_done.is_set():
                results.append(await timed(Prompt(words(48, rng), args.stream_tokens)))
            return results

        async def long_prompt(at: float, text: str):
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
            return await timed(Prompt(text, args.long_output))

        began = time.perf_counter()
        streams = [asyncio.create_task(stream(i)) for i in range(args.streams)]
        await asyncio.sleep(2.0)  # the streams are decoding before the first long prompt comes
        started = time.perf_counter()
        timed_longs = await asyncio.gather(*(long_prompt(at, text) for at, text in long_prompts(args)))
        longs_done.set()
        timed_streams = [r for results in await asyncio.gather(*streams) for r in results]
        duration = time.perf_counter() - began
    long_results = [r for _, r in timed_longs]
    stream_results = [r for _, r in timed_streams]
    itls = [gap for r in stream_results if r.ok for gap in r.itls_s]
    # Which stream gaps overlapped a long prompt's own decoding (first token to last, as its client saw it): a
    # 2,000-token context in the decode batch costs every step more, whoever prefilled it.
    decoding = [(sent + r.ttft_s, sent + r.e2e_s) for sent, r in timed_longs if r.ok]
    alongside, alone = [], []
    for sent, r in timed_streams:
        for begin, end in zip(r.chunk_times_s, r.chunk_times_s[1:]):
            overlaps = any(sent + begin < until and sent + end > since for since, until in decoding)
            (alongside if overlaps else alone).append(end - begin)
    everything = summarise(stream_results + list(long_results), duration, slo)
    longs = summarise(list(long_results), duration, slo)
    return {
        "stream_itl_p50_ms": float(np.percentile(itls, 50) * 1e3), "stream_itl_p99_ms": float(np.percentile(itls, 99) * 1e3),
        "long_ttft_p50_ms": longs["ttft_ms"]["p50"], "long_ttft_p99_ms": longs["ttft_ms"]["p99"],
        "output_tokens_per_s": everything["output_tokens_per_s"], "goodput_rps": everything["goodput"],
        "good_requests": everything["good_requests"], "requests": everything["requests"],
        "failed": everything["failed"], "errors": everything["errors"], "long_prompts": len(long_results),
        "long_prompt_tokens": [r.usage_prompt_tokens for r in long_results], "seconds": duration,
        "stream_itl_alone_ms": percentiles_ms(alone), "stream_itl_alongside_long_decode_ms": percentiles_ms(alongside),
    }


def percentiles_ms(gaps: list[float]) -> dict:
    if not gaps:
        return {"samples": 0}
    return {"samples": len(gaps), "p50": float(np.percentile(gaps, 50) * 1e3), "p99": float(np.percentile(gaps, 99) * 1e3)}


def colocated(budget: int | None, model: list[str], args: argparse.Namespace) -> dict:
    batched = str(budget) if budget else str(args.long_prompt_tokens * 2)  # unchunked: a whole prompt in one step
    # A fixed budget: the settings compare chunk sizes, so serve's ITL target (docs/token_budget.md) stays off.
    process, url = start(["serve", *model, "--threads", "2", "--kv-cache-memory", "1GiB",
                          "--max-num-batched-tokens", batched, "--itl-target-ms", "0"],
                         log_name=f"colocated-{budget or 'unchunked'}")
    try:
        return asyncio.run(run_load(url, args))
    finally:
        process.kill()


def disaggregated(model: list[str], args: argparse.Namespace) -> dict:
    common = ["--threads", "1", "--kv-cache-memory", "1GiB", "--itl-target-ms", "0"]
    prefill, prefill_url = start(["serve", *model, *common, "--role", "prefill", "--max-num-batched-tokens",
                                  str(args.long_prompt_tokens * 2)], cores="0", log_name="prefill")
    decode, decode_url = start(["serve", *model, *common, "--role", "decode", "--max-num-batched-tokens", "256"],
                               cores="1", log_name="decode")
    # The proxy relays every streamed token: on the decode core it competes with the decode steps it relays (the
    # ITL the client sees), on the prefill core with prefill (TTFT). --proxy-core chooses.
    proxy, proxy_url = start(["proxy", "--prefill", prefill_url, "--decode", decode_url, "--local-prefill-tokens", "1"],
                             cores=args.proxy_core, log_name="proxy")
    try:
        result = asyncio.run(run_load(proxy_url, args))
        # The decode engine's own ITL (its step outputs' gaps, the dashboard's 60 s window): what the client sees
        # less the relay through the proxy and the client's own scheduling.
        result["decode_engine_latency"] = httpx.get(f"{decode_url}/dashboard/state", timeout=60).json()["latency"]
        # Its last steps (end time and forward-pass seconds each), kept beside the logs: a gap between two steps'
        # ends longer than the second's forward pass is time the engine thread spent elsewhere.
        steps = httpx.get(f"{decode_url}/v1/steps", timeout=60).json()["data"]
        (LOG_DIR / "decode-steps.json").write_text(json.dumps(steps))
        # Its forward passes' wall time against the engine thread's CPU time in them (one thread): where they spread
        # alike, the pass's own work varied (the core was slowed, not taken); where wall spreads more, it waited.
        passes = [s for s in steps if s["cpu_seconds"] is not None]
        result["decode_forward_ms"] = percentiles_ms([s["seconds"] for s in passes])
        result["decode_forward_cpu_ms"] = percentiles_ms([s["cpu_seconds"] for s in passes])
        return result
    finally:
        for process in (proxy, prefill, decode):
            process.kill()


def table(settings: dict[str, dict]) -> str:
    lines = ["| setting | stream ITL p50 ms | p99 ms | p99/p50 | long TTFT p50 ms | p99 ms | output tok/s | "
             "goodput req/s (good/all) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in settings.items():
        lines.append(f"| {name} | {r['stream_itl_p50_ms']:.1f} | {r['stream_itl_p99_ms']:.1f} | "
                     f"{r['stream_itl_p99_ms'] / r['stream_itl_p50_ms']:.2f} | {r['long_ttft_p50_ms']:,.0f} | "
                     f"{r['long_ttft_p99_ms']:,.0f} | {r['output_tokens_per_s']:.1f} | {r['goodput_rps']:.3f} "
                     f"({r['good_requests']}/{r['requests']}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--budgets", default="64,256", help="chunk budgets of the colocated runs")
    parser.add_argument("--settings", default=None,
                        help="run only these, comma-separated (chunked-B, unchunked, disaggregated); default: all")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=48, help="output of each stream request")
    parser.add_argument("--long-prompt-tokens", type=int, default=2000, help="words of each long prompt (~tokens)")
    parser.add_argument("--long-output", type=int, default=16)
    parser.add_argument("--long-rate", type=float, default=0.025, help="long prompts per second (Poisson)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of long-prompt arrivals per setting")
    parser.add_argument("--slo-ttft-ms", type=float, default=40000.0)
    parser.add_argument("--slo-itl-ms", type=float, default=600.0, help="applied to each request's mean ITL")
    parser.add_argument("--proxy-core", default="1", help="core of the disaggregated setting's proxy (decode's: 1)")
    parser.add_argument("--json", default=None, help="add the results to this file (same load only)")
    args = parser.parse_args()
    names = [f"chunked-{b}" for b in args.budgets.split(",")] + ["unchunked", "disaggregated"]
    chosen = names if args.settings is None else args.settings.split(",")
    if unknown := set(chosen) - set(names):
        parser.error(f"unknown settings {sorted(unknown)} (choose from {', '.join(names)})")
    load = {key: getattr(args, key) for key in LOAD_ARGS}
    saved = {"load": load, "settings": {}}
    if args.json and Path(args.json).exists():
        saved = json.loads(Path(args.json).read_text())
        if saved["load"] != load:
            parser.error(f"{args.json} holds results under another load ({saved['load']}): use another file")
    print(f"long prompts arrive at {[round(at, 1) for at, _ in long_prompts(args)]} s", flush=True)
    model = [args.model] if args.model else []
    for name in chosen:
        began = time.strftime("%H:%M:%S", time.gmtime())
        if name == "disaggregated":
            result = disaggregated(model, args)
        else:
            result = colocated(None if name == "unchunked" else int(name.split("-")[1]), model, args)
        saved["settings"][name] = {**result, "started_utc": began,
                                   **({"proxy_core": args.proxy_core} if name == "disaggregated" else {})}
        print(name, result, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(saved, indent=2))
    print(table({name: saved["settings"][name] for name in names if name in saved["settings"]}))


if __name__ == "__main__":
    main()
