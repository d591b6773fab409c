"""Three tenants against one server: an interactive one (priority interactive, short prompts, streamed), a batch one
(priority batch, long prompts) and one driven past its tokens-per-minute limit; and the same load against a server
without tenants.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/tenants_load.py [--threads 2] [--rounds 1] [--json]

Each round starts two `ridgeline serve` processes in turn (the order alternates from round to round):

- with `--tenants`: first the interactive tenant runs alone (until the next wall-clock minute starts, at least
  --alone-s), then all three run for --mixed-s seconds from that minute's start, so the mixed phase covers one
  whole limiter window. Reported: the interactive tenant's TTFT and ITL (p50, p99) alone and mixed and their ratio
  (target: p99s within 1.3x of alone); the over-limit tenant's admitted tokens in that one window against its
  configured TPM (target: within 5 % below, never above) and whether every answer past the limit was a 429;
  each tenant's output tok/s; /metrics' per-tenant counts against the client's own (target: equal); and where
  the interactive tenant's slowest gaps went, from the engine's own step records (GET /v1/steps): the forward
  passes inside each gap (the longest one's prefill, its ITL budget, its CPU time against its wall time, which
  falls short when the pass waits for the GIL or a core) and the time no pass ran.
- without tenants: the same streams, without keys, for --mixed-s seconds: the output tok/s to match (target: the
  tenanted run's total no lower).

Results go to benchmarks/results/tenants_load/.
"""

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from ridgeline.bench.served import ridgeline_server
from ridgeline.tenancy.keys import hash_key

KEYS = {"interactive": "rl-bench-interactive", "batch": "rl-bench-batch", "over": "rl-bench-over"}
RESULTS = Path(__file__).parent / "results" / "tenants_load"
WORDS = "the quick brown fox jumps over a lazy dog while a server answers every prompt it is given".split()


def tenants_file(path: Path, tpm: int) -> None:
    path.write_text(f"""
[tenants.interactive]
keys = ["{hash_key(KEYS['interactive'])}"]
priority = "interactive"

[tenants.batch]
keys = ["{hash_key(KEYS['batch'])}"]
priority = "batch"
tokens_per_day = 100000000

[tenants.over]
keys = ["{hash_key(KEYS['over'])}"]
tokens_per_minute = {tpm}
""")


def words(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i) % len(WORDS)] for i in range(n))


class Tally:
    def __init__(self):
        self.ok = self.refused = self.prompt_tokens = self.completion_tokens = 0
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        # Wall-clock (time.time()) spans of every TTFT and ITL, to find the engine steps that fell inside each.
        self.ttft_spans: list[tuple[float, float]] = []
        self.itl_spans: list[tuple[float, float]] = []
        self.events: list[tuple[float, int, int]] = []  # (wall time sent, status, total tokens)


async def stream_one(client: httpx.AsyncClient, key: str | None, prompt: str, max_tokens: int, tally: Tally) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    sent, last = time.perf_counter(), None
    sent_wall, last_wall = time.time(), None
    async with client.stream("POST", "/v1/completions", json=body, headers=headers(key)) as r:
        if r.status_code != 200:
            await r.aread()
            tally.refused += r.status_code == 429
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            now, now_wall = time.perf_counter(), time.time()
            if chunk.get("usage"):
                tally.prompt_tokens += chunk["usage"]["prompt_tokens"]
                tally.completion_tokens += chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                if last is None:
                    tally.ttfts.append(now - sent)
                    tally.ttft_spans.append((sent_wall, now_wall))
                else:
                    tally.itls.append(now - last)
                    tally.itl_spans.append((last_wall, now_wall))
                last, last_wall = now, now_wall
    tally.ok += 1


async def whole_one(client: httpx.AsyncClient, key: str | None, prompt: str, max_tokens: int, tally: Tally) -> float:
    """One non-streamed request; the seconds a 429 asked to wait (0 for a 200)."""
    sent = time.time()
    r = await client.post("/v1/completions", headers=headers(key),
                          json={"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
    if r.status_code == 429:
        tally.refused += 1
        tally.events.append((sent, 429, 0))
        return float(r.headers["retry-after"])
    r.raise_for_status()
    usage = r.json()["usage"]
    tally.ok += 1
    tally.prompt_tokens += usage["prompt_tokens"]
    tally.completion_tokens += usage["completion_tokens"]
    tally.events.append((sent, 200, usage["total_tokens"]))
    return 0.0


async def loop(until: float, one) -> None:
    seed = 0
    while time.time() < until:
        seed += 1
        await one(seed)


def step_summary(step: dict) -> dict:
    return {"seconds": step["seconds"], "cpu_seconds": step["cpu_seconds"], "kind": step["kind"],
            "decode_rows": step["decode_rows"], "prefill_tokens": step["prefill_tokens"],
            "prefill_limit": step["prefill_limit"], "itl_target_s": step["itl_target_s"],
            "predicted_s": step["predicted_s"]}


def attribute(spans: list[tuple[float, float]], steps: list[dict], share: float = 0.01) -> dict:
    """Where the slowest `share` of these client-side gaps (wall clock) went, against the engine's step records:
    how much of each gap forward passes filled (and the longest of them: its size, its budget, its CPU time
    against its wall time, which falls short when the pass waited for the GIL or a core), and how much of it no
    pass ran (scheduling, sampling, detokenising, the hop to the event loop, HTTP, the client)."""
    if not spans or not steps:
        return {}
    ends = np.array([step["timestamp"] for step in steps])
    starts = ends - np.array([step["seconds"] for step in steps])
    slow = sorted(spans, key=lambda span: span[0] - span[1])[:max(1, int(len(spans) * share))]
    rows = []
    for a, b in slow:
        inside = np.nonzero((ends > a) & (starts < b))[0]
        overlap = [min(b, ends[i]) - max(a, starts[i]) for i in inside]
        longest = max(inside, key=lambda i: steps[i]["seconds"]) if len(inside) else None
        rows.append({"gap_s": b - a, "passes": len(inside), "pass_s": float(sum(overlap)),
                     "outside_s": float(b - a - sum(overlap)),
                     "longest": step_summary(steps[longest]) if longest is not None else None})
    med = lambda key: float(np.median([row[key] for row in rows]))  # noqa: E731
    return {"n": len(rows), "gap_p50_ms": med("gap_s") * 1e3, "passes_p50": med("passes"),
            "pass_p50_ms": med("pass_s") * 1e3, "outside_p50_ms": med("outside_s") * 1e3,
            "longest_pass_p50_ms": float(np.median([row["longest"]["seconds"] if row["longest"] else 0
                                                    for row in rows])) * 1e3,
            "gaps": rows}


def step_profile(steps: list[dict], interactive_context: int) -> dict:
    """The engine's steps while the interactive tenant decoded (a decode row at a context below
    `interactive_context`, which the batch tenant's long prompts never are): each pass's time, CPU share and
    prefill, and the time between passes."""
    ours = [step for step in steps if any(c < interactive_context for c in step["decode_contexts"])]
    between = [b["timestamp"] - b["seconds"] - a["timestamp"] for a, b in zip(steps, steps[1:])
               if not b["after_idle"]]

    def pct(values):
        return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
                "max": float(max(values))} if values else {}

    return {"steps": len(steps), "with_interactive_decode": len(ours),
            "pass_ms": pct([step["seconds"] * 1e3 for step in ours]),
            "cpu_share": pct([step["cpu_seconds"] / step["seconds"] for step in ours if step["cpu_seconds"]]),
            "prefill_tokens": pct([step["prefill_tokens"] for step in ours]),
            "decode_rows": pct([step["decode_rows"] for step in ours]),
            "itl_target_ms": pct([step["itl_target_s"] * 1e3 for step in ours if step["itl_target_s"]]),
            "between_passes_ms": pct([gap * 1e3 for gap in between])}


def percentiles(values: list[float]) -> dict:
    return {"p50_ms": float(np.percentile(values, 50) * 1e3), "p99_ms": float(np.percentile(values, 99) * 1e3),
            "n": len(values)} if values else {}


def headers(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


async def mixed_load(client: httpx.AsyncClient, args, end: float, keys: dict) -> tuple[Tally, Tally, Tally, float]:
    """All three tenants' streams until `end` (wall clock): the interactive, batch and over-limit tallies and the
    seconds it took. `keys` empty: the same streams without keys, against a server without tenants."""
    mixed, batch, over = Tally(), Tally(), Tally()
    started = time.perf_counter()

    async def over_one(seed):
        if await whole_one(client, keys.get("over"), words(8, seed), args.over_tokens, over):
            await asyncio.sleep(args.over_retry_s)  # keep knocking: every answer past the limit must be a 429

    await asyncio.gather(
        *(loop(end, lambda seed: stream_one(client, keys.get("interactive"), words(args.short_words, seed),
                                            args.interactive_tokens, mixed)) for _ in range(args.interactive_streams)),
        *(loop(end, lambda seed: stream_one(client, keys.get("batch"), words(args.long_words, seed), args.batch_tokens,
                                            batch)) for _ in range(args.batch_streams)),
        *(loop(end, over_one) for _ in range(args.over_workers)))
    return mixed, batch, over, time.perf_counter() - started


def throughput(mixed: Tally, batch: Tally, over: Tally, elapsed: float) -> dict:
    return {"interactive_tokens_per_s": mixed.completion_tokens / elapsed,
            "batch_tokens_per_s": batch.completion_tokens / elapsed,
            "over_tokens_per_s": over.completion_tokens / elapsed,
            "all_tokens_per_s": (mixed.completion_tokens + batch.completion_tokens + over.completion_tokens) / elapsed,
            "batch_requests": batch.ok}


async def run_untenanted(url: str, args) -> dict:
    """The same streams, without keys, against a server without --tenants: the throughput to match."""
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=64)) as client:
        await stream_one(client, None, "warm up", 4, Tally())
        mixed, batch, over, elapsed = await mixed_load(client, args, time.time() + args.mixed_s, {})
    return {"tenants": False, "mixed_s": elapsed, "throughput": throughput(mixed, batch, over, elapsed),
            "interactive_mixed": {"ttft": percentiles(mixed.ttfts), "itl": percentiles(mixed.itls)}}


async def run(url: str, args) -> dict:
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await stream_one(client, KEYS["interactive"], "warm up", 4, Tally())
        now = time.time()
        start = (now // 60 + 1) * 60
        if start - now < args.alone_s:
            start += 60
        alone, alone_started = Tally(), time.time()
        await asyncio.gather(*(loop(start - 1, lambda seed: stream_one(
            client, KEYS["interactive"], words(args.short_words, seed), args.interactive_tokens, alone))
            for _ in range(args.interactive_streams)))
        while time.time() < start:
            await asyncio.sleep(0.01)
        mixed, batch, over, elapsed = await mixed_load(client, args, start + args.mixed_s, KEYS)
        metrics = (await client.get("/metrics")).text
        recorded = (await client.get("/v1/steps", params={"since": alone_started},
                                     headers=headers(KEYS["interactive"]))).json()["data"]
    if args.steps_out:  # the raw step records, for a closer look than the summary below (large: not kept here)
        Path(args.steps_out).write_text(json.dumps({"alone_started": alone_started, "start": start, "steps": recorded,
                                                    "itl_spans": mixed.itl_spans, "ttft_spans": mixed.ttft_spans}))
    steps = [step for step in recorded if step["timestamp"] >= start]
    steps_alone = [step for step in recorded if step["timestamp"] < start - 1]
    window = [(t, status, tokens) for t, status, tokens in over.events if start <= t < start + 60]
    admitted = sum(tokens for _, status, tokens in window if status == 200)
    first_refusal = next((t for t, status, _ in window if status == 429), None)
    ok_after_refusal = sum(1 for t, status, _ in window if first_refusal is not None and t > first_refusal + 0.5
                           and status == 200)

    def metric(name, tenant, extra=""):
        labels = [f'tenant="{tenant}"', *([extra.strip(",")] if extra else [])]
        found = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith(name + "{") and all(label in line for label in labels)]
        return found[0] if found else float("nan")

    # The interactive tenant's alone-phase requests count in /metrics too: compare against both phases.
    client_counts = {"interactive": alone.ok + mixed.ok + 1, "batch": batch.ok, "over": over.ok}
    server_counts = {t: metric("ridgeline_tenant_requests_total", t) for t in client_counts}
    refused = {"client": over.refused, "server": metric("ridgeline_tenant_rejected_total", "over",
                                                        ',limit="tokens_per_minute"')}
    interactive_alone = {"ttft": percentiles(alone.ttfts), "itl": percentiles(alone.itls)}
    interactive_mixed = {"ttft": percentiles(mixed.ttfts), "itl": percentiles(mixed.itls)}
    return {
        "interactive_alone": interactive_alone, "interactive_mixed": interactive_mixed,
        "ratio_p99_ttft": interactive_mixed["ttft"]["p99_ms"] / interactive_alone["ttft"]["p99_ms"],
        "ratio_p99_itl": interactive_mixed["itl"]["p99_ms"] / interactive_alone["itl"]["p99_ms"],
        "tenants": True,
        "throughput": throughput(mixed, batch, over, elapsed),
        "over_limit": {"tpm": args.tpm, "admitted_tokens_in_window": admitted, "of_tpm": admitted / args.tpm,
                       "requests_in_window": len(window), "refused_in_window": sum(s == 429 for _, s, _ in window),
                       "admitted_after_first_refusal": ok_after_refusal},
        "metrics_requests": {"client": client_counts, "server": server_counts,
                             "equal": client_counts == server_counts},
        "metrics_refused": refused | {"equal": refused["client"] == refused["server"]},
        "mixed_s": elapsed,
        "where_the_tail_went": {
            "interactive_steps_alone": step_profile(steps_alone, interactive_context=args.long_words // 2),
            "interactive_steps": step_profile(steps, interactive_context=args.long_words // 2),
            "ttft": attribute(mixed.ttft_spans, steps), "itl": attribute(mixed.itl_spans, steps)},
        "tenant_metrics": [line for line in metrics.splitlines() if line.startswith("ridgeline_tenant_")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--alone-s", type=float, default=20, help="least seconds of the interactive tenant alone")
    parser.add_argument("--mixed-s", type=float, default=62, help="seconds of all three (>= 60: one whole window)")
    parser.add_argument("--interactive-streams", type=int, default=2)
    parser.add_argument("--interactive-tokens", type=int, default=32)
    parser.add_argument("--short-words", type=int, default=16)
    parser.add_argument("--batch-streams", type=int, default=2)
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--long-words", type=int, default=600)
    parser.add_argument("--tpm", type=int, default=1000, help="the over-limit tenant's tokens per minute")
    parser.add_argument("--over-tokens", type=int, default=16)
    parser.add_argument("--over-workers", type=int, default=2)
    parser.add_argument("--over-retry-s", type=float, default=0.5, help="pause after a 429 before knocking again")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of (the tenanted run, the same load against a server without tenants), the order "
                             "alternating from round to round")
    parser.add_argument("--serve-args", default="", help="more `serve` options for both servers, e.g. "
                        "'--engine-core process'")
    parser.add_argument("--steps-out", default=None, help="write the tenanted run's raw step records here (JSON)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    extra = shlex.split(args.serve_args)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tenants.toml"
        tenants_file(path, args.tpm)
        common = [*([args.model] if args.model else []), "--threads", str(args.threads), *extra]
        for index in range(args.rounds):
            for tenanted in ((True, False) if index % 2 == 0 else (False, True)):
                serve = [*common, "--tenants", str(path)] if tenanted else common
                with ridgeline_server(*serve) as (url, _):
                    result = asyncio.run(run(url, args) if tenanted else run_untenanted(url, args))
                runs.append({"round": index, **result})
                print(summary_line(runs[-1]), file=sys.stderr, flush=True)
    tenanted = [r for r in runs if r["tenants"]]
    untenanted = [r for r in runs if not r["tenants"]]

    def median(rows, *keys):
        values = []
        for row in rows:
            for key in keys:
                row = row[key]
            values.append(row)
        return float(statistics.median(values))

    result = {
        "summary": {
            "ratio_p99_ttft": median(tenanted, "ratio_p99_ttft"), "ratio_p99_itl": median(tenanted, "ratio_p99_itl"),
            "all_tokens_per_s": {"tenants": median(tenanted, "throughput", "all_tokens_per_s"),
                                 "no_tenants": median(untenanted, "throughput", "all_tokens_per_s")},
            "over_limit_of_tpm": [r["over_limit"]["of_tpm"] for r in tenanted],
            "metrics_equal": all(r["metrics_requests"]["equal"] and r["metrics_refused"]["equal"] for r in tenanted)},
        "runs": runs, "args": vars(args), "commit": commit(),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"{stamp}.json").write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for run_ in runs:
        print(summary_line(run_))
    s = result["summary"]
    print(f"median over rounds: p99 TTFT x{s['ratio_p99_ttft']:.2f}, ITL x{s['ratio_p99_itl']:.2f} of alone "
          f"(target <= 1.3); all output {s['all_tokens_per_s']['tenants']:.1f} tok/s with tenants, "
          f"{s['all_tokens_per_s']['no_tenants']:.1f} without; /metrics equal: {s['metrics_equal']}")


def summary_line(run_: dict) -> str:
    t = run_["throughput"]
    m = run_["interactive_mixed"]
    line = (f"round {run_['round']}, {'tenants' if run_['tenants'] else 'no tenants'}: interactive mixed TTFT p99 "
            f"{m['ttft']['p99_ms']:.0f} ms, ITL p99 {m['itl']['p99_ms']:.1f} ms")
    if run_["tenants"]:
        a, o = run_["interactive_alone"], run_["over_limit"]
        line += (f" (alone {a['ttft']['p99_ms']:.0f} / {a['itl']['p99_ms']:.1f} ms: x{run_['ratio_p99_ttft']:.2f}, "
                 f"x{run_['ratio_p99_itl']:.2f}); over-limit {o['admitted_tokens_in_window']} of {o['tpm']} TPM, "
                 f"{o['admitted_after_first_refusal']} admitted after its first refusal; /metrics equal "
                 f"{run_['metrics_requests']['equal'] and run_['metrics_refused']['equal']}")
    return line + (f"; output {t['all_tokens_per_s']:.1f} tok/s (batch {t['batch_tokens_per_s']:.1f}, interactive "
                   f"{t['interactive_tokens_per_s']:.1f})")


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    main()
