"""The engine core in its own process against the engine on a thread of the server's process, under the load that
stalls it: --streams streams decoding while prompts of --long-prompt-tokens words arrive (disagg_vs_colocated.py's
load, colocated, shortened to fit a few minutes).

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/engine_core_split.py \
        --json benchmarks/results/engine_core_split/engine_core_split.json

In one process, the server's event loop tokenises each long prompt (tens of ms of pure Python with the GIL held)
while the engine thread waits for the GIL between its kernels; with `--engine-core process` the engine steps in a
process of its own and the tokenising only competes for a core. Each round starts a fresh `ridgeline serve` per
setting, alternating the order (thread, process; process, thread; ...) so drift in the machine falls on both
alike, and runs the same load: the streams (closed loop, fixed seeds) decode, and --long-count long prompts
are sent one after another, each --long-gap seconds after the previous one's answer; the streams go on until
the last one is answered.

Reported per setting, the median over its rounds of: the streams' ITL p50 and p99; the *arrival gap*, the stream
gap during which a long prompt was sent (where tokenising it lands, before any of its prefill: in one process it
holds the engine's GIL), against the plain decode gap (gaps before the first long prompt); the long prompts' TTFT;
output tok/s; and the CPU seconds each process (the server; the engine core) spent during the load, from /proc.
"""

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disagg_vs_colocated import start, words  # noqa: E402

from ridgeline.bench.bench_serve import BenchServeConfig, Prompt, send_request  # noqa: E402

SETTINGS = ("thread", "process")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (all its threads), not its children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def core_pid(server_pid: int) -> int | None:
    """The engine core among the server's children (multiprocessing also starts a resource tracker)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    for pid in children:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"spawn_main" in command and b"resource_tracker" not in command:
            return int(pid)
    return None


def ms(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q) * 1e3) if values else None


async def run_load(url: str, load: Namespace) -> dict:
    config = BenchServeConfig(base_url=url)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0)) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        longs_done = asyncio.Event()
        epoch = time.perf_counter()

        async def timed(prompt: Prompt):
            sent = time.perf_counter() - epoch
            return sent, await send_request(client, config, model, prompt)

        async def stream(index: int) -> list:
            rng, results = random.Random(1000 + index), []
            while not longs_done.is_set():
                results.append(await timed(Prompt(words(48, rng), load.stream_tokens)))
            return results

        async def long_prompts() -> list:
            """One after another, each --long-gap seconds after the last was answered: every one arrives while only
            the streams decode, so the gap it lands in holds its tokenising and nothing of another's prefill."""
            done = []
            for index in range(load.long_count):
                await asyncio.sleep(load.long_gap)
                done.append(await timed(Prompt(words(load.long_prompt_tokens, random.Random(index)), load.long_output)))
            return done

        streams = [asyncio.create_task(stream(i)) for i in range(load.streams)]
        timed_longs = await long_prompts()
        longs_done.set()
        timed_streams = [r for results in await asyncio.gather(*streams) for r in results]
        duration = time.perf_counter() - epoch
    busy = [(at, at + r.e2e_s if r.ok else duration) for at, r in timed_longs]  # a long prompt sent, not yet answered
    gaps, arrival, plain = [], [], []
    for sent, r in timed_streams:
        if not r.ok:
            continue
        for begin, end in zip(r.chunk_times_s, r.chunk_times_s[1:]):
            begin, end = sent + begin, sent + end
            gaps.append(end - begin)
            if any(begin <= at < end for at, _ in timed_longs):
                arrival.append(end - begin)
            elif not any(begin < until and end > since for since, until in busy):
                plain.append(end - begin)
    longs = [r for _, r in timed_longs]
    results = [r for _, r in timed_streams] + longs
    return {
        "stream_itl_p50_ms": ms(gaps, 50), "stream_itl_p99_ms": ms(gaps, 99),
        "arrival_gap_p50_ms": ms(arrival, 50), "arrival_gap_max_ms": ms(arrival, 100), "arrival_gaps": len(arrival),
        "plain_decode_gap_p50_ms": ms(plain, 50),
        "long_ttft_p50_ms": ms([r.ttft_s for r in longs if r.ok], 50),
        "output_tokens_per_s": sum(r.output_tokens for r in results if r.ok) / duration,
        "requests": len(results), "failed": sum(not r.ok for r in results), "seconds": duration,
    }


def one_round(setting: str, args: Namespace, load: Namespace) -> dict:
    model = [args.model] if args.model else []
    process, url = start(["serve", *model, "--threads", str(args.threads), "--kv-cache-memory", "1GiB",
                          "--max-num-batched-tokens", str(args.budget), "--itl-target-ms", "0",
                          "--engine-core", setting], log_name=f"engine-core-{setting}")
    try:
        pids = {"server": process.pid}
        if setting == "process":
            pids["engine_core"] = core_pid(process.pid)
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        result = asyncio.run(run_load(url, load))
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        result["cpu_seconds"] = {name: round(after[name] - before[name], 2) for name in pids}
        result["cpu_per_wall"] = {name: round((after[name] - before[name]) / result["seconds"], 3) for name in pids}
        return result
    finally:
        process.terminate()  # SIGTERM: the server stops its core too
        process.wait(60)


SUMMARY_KEYS = ("stream_itl_p50_ms", "stream_itl_p99_ms", "arrival_gap_p50_ms", "arrival_gap_max_ms",
                "plain_decode_gap_p50_ms", "long_ttft_p50_ms", "output_tokens_per_s")


def median(values) -> float | None:
    known = [value for value in values if value is not None]  # None: no sample of that kind in a round
    return statistics.median(known) if known else None


def summary(rounds: list[dict]) -> dict:
    out = {key: median(r[key] for r in rounds) for key in SUMMARY_KEYS}
    out["cpu_seconds"] = {name: statistics.median(r["cpu_seconds"][name] for r in rounds)
                          for name in rounds[0]["cpu_seconds"]}
    out["cpu_per_wall"] = {name: statistics.median(r["cpu_per_wall"][name] for r in rounds)
                           for name in rounds[0]["cpu_per_wall"]}
    out["failed"] = sum(r["failed"] for r in rounds)
    out["requests"] = sum(r["requests"] for r in rounds)
    return out


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def table(summaries: dict[str, dict]) -> str:
    lines = ["| engine core | stream ITL p50 ms | p99 ms | arrival gap p50 ms | max | plain decode gap p50 ms | "
             "long TTFT p50 ms | output tok/s | CPU s: server | engine core | failed/requests |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        cpu = s["cpu_seconds"]
        lines.append(f"| {name} | {fmt(s['stream_itl_p50_ms'])} | {fmt(s['stream_itl_p99_ms'])} | "
                     f"{fmt(s['arrival_gap_p50_ms'])} | {fmt(s['arrival_gap_max_ms'])} | "
                     f"{fmt(s['plain_decode_gap_p50_ms'])} | {fmt(s['long_ttft_p50_ms'])} | "
                     f"{fmt(s['output_tokens_per_s'])} | {cpu['server']:.1f} | {cpu.get('engine_core', 0.0):.1f} | "
                     f"{s['failed']}/{s['requests']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs both settings, order alternating")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the engine")
    parser.add_argument("--budget", type=int, default=256, help="--max-num-batched-tokens (chunked prefill)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=128)
    parser.add_argument("--long-prompt-tokens", type=int, default=2000, help="words of each long prompt")
    parser.add_argument("--long-output", type=int, default=16)
    parser.add_argument("--long-count", type=int, default=2, help="long prompts per run")
    parser.add_argument("--long-gap", type=float, default=2.0, help="seconds of decoding alone before each long prompt")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    load = Namespace(streams=args.streams, stream_tokens=args.stream_tokens, long_prompt_tokens=args.long_prompt_tokens,
                     long_output=args.long_output, long_count=args.long_count, long_gap=args.long_gap)
    rounds: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for index in range(args.rounds):
        for setting in (SETTINGS if index % 2 == 0 else SETTINGS[::-1]):
            result = one_round(setting, args, load)
            result["round"] = index
            rounds[setting].append(result)
            print(setting, index, {k: result[k] for k in (*SUMMARY_KEYS, "cpu_seconds", "failed")}, flush=True)
            if args.json:  # after every round: a run cut short keeps what it measured
                save(args, load, began, rounds, None)
    summaries = {name: summary(results) for name, results in rounds.items()}
    print(table(summaries))
    if args.json:
        save(args, load, began, rounds, summaries)


def save(args: argparse.Namespace, load: Namespace, began: str, rounds: dict, summaries: dict | None) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "started_utc": began, "commit": commit, "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "load": vars(load), "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "summary": summaries, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
