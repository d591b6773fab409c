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

`--held C` measures something else, for `--api-server-counts` (default 1,2) API processes in front of the core:

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/engine_core_split.py --held 1000 \
        --json benchmarks/results/engine_core_split/held_connections.json

C streaming requests are opened at once (asyncio + httpx, one connection each) and read slowly (--read-delay
seconds between events). Sampled every half second on the server side: the ESTABLISHED connections each API process
holds (its socket fds against /proc/net/tcp) and the RSS of every process (supervisor, API processes, core). Reported
per API-process count: the most connections held at once, each process's RSS before the load and at that moment,
the RSS per held connection, and how every request ended: completed, an explicit error (an HTTP error with its
code, or an error event in the stream), or a transport failure (none expected: no client may hang or be cut).
"""

import argparse
import asyncio
import contextlib
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


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return None


def server_family(server_pid: int) -> dict[str, int]:
    """role -> pid: the serve process, its engine core, its API processes (the ones holding a TCP listener)."""
    family = {"serve": server_pid}
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    api = 0
    for pid in map(int, children):
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"spawn_main" not in command or b"resource_tracker" in command:
            continue
        if socket_inodes_of(pid) & listening_inodes():
            family[f"api_{api}"] = pid
            api += 1
        else:
            family["engine_core"] = pid
    return family


def tcp_table() -> list[list[str]]:
    rows = []
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}") as table:
            rows += [line.split() for line in list(table)[1:]]
    return rows


def listening_inodes() -> set[str]:
    return {row[9] for row in tcp_table() if row[3] == "0A"}


def established_inodes(port: int) -> set[str]:
    """Sockets of connections whose local port is the server's (the server's ends; state 01: ESTABLISHED)."""
    return {row[9] for row in tcp_table() if row[3] == "01" and int(row[1].rsplit(":", 1)[1], 16) == port}


def socket_inodes_of(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


async def hold(url: str, held: int, read_delay: float, max_tokens: int, family: dict[str, int]) -> dict:
    """Open `held` slow streams at once; sample the server while they run; how each ended."""
    port = int(url.rsplit(":", 1)[1])
    api = {role: pid for role, pid in family.items() if role.startswith("api_")} or {"serve": family["serve"]}
    before = {role: rss_mib(pid) for role, pid in family.items()}
    samples: list[dict] = []
    ended: dict[str, int] = {}
    outstanding = held

    def count(kind: str) -> None:
        ended[kind] = ended.get(kind, 0) + 1

    async def one(client: httpx.AsyncClient, index: int) -> None:
        nonlocal outstanding
        body = {"prompt": f"Request {index}: a short story about", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        try:
            async with client.stream("POST", "/v1/completions", json=body) as reply:
                if reply.status_code != 200:
                    error = json.loads(await reply.aread())["error"]
                    count(f"http_{reply.status_code}_{error.get('code') or error.get('type')}")
                    return
                last = None
                async for line in reply.aiter_lines():
                    if line.startswith("data:"):
                        last = line
                        if '"error"' in line:
                            count(f"stream_error_{json.loads(line[5:])['error'].get('code')}")
                            return
                        await asyncio.sleep(read_delay)  # a slow reader
                count("completed" if last == "data: [DONE]" else "stream_cut")
        except httpx.HTTPError as error:
            count(f"transport_{type(error).__name__}")
        finally:
            outstanding -= 1

    async def sample() -> None:
        while outstanding > 0:
            established = established_inodes(port)
            samples.append({"t": time.perf_counter(), "in_flight_clients": outstanding,
                            "held": {role: len(socket_inodes_of(pid) & established) for role, pid in api.items()},
                            "rss_mib": {role: rss_mib(pid) for role, pid in family.items()}})
            await asyncio.sleep(0.5)

    limits = httpx.Limits(max_connections=held + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0), limits=limits) as client:
        began = time.perf_counter()
        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(one(client, index) for index in range(held)))
        await sampler
        seconds = time.perf_counter() - began
    peak = peak_sample(samples, api)
    held_at_peak = sum(peak["held"].values())
    api_growth = sum(peak["rss_mib"][role] - before[role] for role in api)
    return {
        "connections": held, "seconds": round(seconds, 1), "ended": dict(sorted(ended.items())),
        "most_held_at_once": held_at_peak, "held_per_api_process_at_peak": peak["held"],
        "rss_mib_before": {k: round(v, 1) for k, v in before.items() if v is not None},
        "rss_mib_at_peak": {k: round(v, 1) for k, v in peak["rss_mib"].items() if v is not None},
        "api_rss_growth_mib": round(api_growth, 1),
        "api_rss_kib_per_held_connection": round(api_growth * 1024 / held_at_peak, 1) if held_at_peak else None,
        "core_rss_growth_mib": round(peak["rss_mib"]["engine_core"] - before["engine_core"], 1)
        if "engine_core" in family else None,
        "samples": [{**s, "t": round(s["t"] - began, 2)} for s in samples],
    }


def peak_sample(samples: list[dict], api: dict) -> dict:
    """The moment the most connections were held; of those moments, the one where the API processes' RSS was
    highest (the first such sample comes right after the connections opened, before their requests' state was)."""
    most = max(sum(s["held"].values()) for s in samples)
    return max((s for s in samples if sum(s["held"].values()) == most),
               key=lambda s: sum(s["rss_mib"][role] or 0 for role in api))


def held_round(count: int, args: Namespace) -> dict:
    model = [args.model] if args.model else []
    options = ["--api-server-count", str(count)] if count > 1 else []
    process, url = start(["serve", *model, "--threads", str(args.threads), "--engine-core", "process", *options,
                          "--max-waiting", str(args.held), "--drain-timeout", "5"], log_name=f"held-{count}")
    try:
        for _ in range(100):  # every API process listening (until then the kernel gives its connections to others)
            family = server_family(process.pid)
            if len([role for role in family if role.startswith("api_")]) == count or count == 1:
                break
            time.sleep(0.2)
        httpx.post(f"{url}/v1/completions", json={"prompt": "warm up", "max_tokens": 4}, timeout=300)
        result = asyncio.run(hold(url, args.held, args.read_delay, args.held_tokens, family))
        result["api_server_count"] = count
        result["pids"] = family
        return result
    finally:
        process.terminate()
        process.wait(120)


def held_main(args: Namespace) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # the client's sockets, and the server's (inherited)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.held + 256)), hard))
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    results = []
    for count in (int(c) for c in args.api_server_counts.split(",")):
        result = held_round(count, args)
        results.append(result)
        print({k: v for k, v in result.items() if k != "samples"}, flush=True)
        if args.json:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({
                "started_utc": began, "commit": commit.strip(), "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(), "settings": {k: v for k, v in vars(args).items() if k != "json"},
                "results": results}, indent=2))


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
    parser.add_argument("--held", type=int, default=0, help="instead: hold this many slow streaming connections")
    parser.add_argument("--api-server-counts", default="1,2", help="with --held: API-process counts, in order")
    parser.add_argument("--read-delay", type=float, default=0.25, help="with --held: seconds a reader waits per event")
    parser.add_argument("--held-tokens", type=int, default=16, help="with --held: max_tokens of each stream")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.held:
        held_main(args)
        return
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
