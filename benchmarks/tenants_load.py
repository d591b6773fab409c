"""Three tenants against one server: an interactive one (priority interactive, short prompts, streamed), a batch one
(priority batch, long prompts) and one driven past its tokens-per-minute limit.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/tenants_load.py [--threads 2] [--json]

One `ridgeline serve --tenants` process. First the interactive tenant runs alone (until the next wall-clock minute
starts, at least --alone-s), then all three run for --mixed-s seconds from that minute's start, so the mixed phase
covers one whole limiter window. Reported: the interactive tenant's TTFT and ITL (p50, p99) alone and mixed and
their ratio (target: p99s within 1.3x of alone); the over-limit tenant's admitted tokens in that one window against
its configured TPM (target: within 5 % below, never above) and whether every answer past the limit was a 429;
the batch tenant's throughput; and /metrics' per-tenant counts against the client's own (target: equal).
Results go to benchmarks/results/tenants_load/.
"""

import argparse
import asyncio
import json
import os
import statistics
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
        self.events: list[tuple[float, int, int]] = []  # (wall time sent, status, total tokens)


async def stream_one(client: httpx.AsyncClient, key: str, prompt: str, max_tokens: int, tally: Tally) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    sent, last = time.perf_counter(), None
    async with client.stream("POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            await r.aread()
            tally.refused += r.status_code == 429
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("usage"):
                tally.prompt_tokens += chunk["usage"]["prompt_tokens"]
                tally.completion_tokens += chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                if last is None:
                    tally.ttfts.append(now - sent)
                else:
                    tally.itls.append(now - last)
                last = now
    tally.ok += 1


async def whole_one(client: httpx.AsyncClient, key: str, prompt: str, max_tokens: int, tally: Tally) -> float:
    """One non-streamed request; the seconds a 429 asked to wait (0 for a 200)."""
    sent = time.time()
    r = await client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
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


def percentiles(values: list[float]) -> dict:
    return {"p50_ms": float(np.percentile(values, 50) * 1e3), "p99_ms": float(np.percentile(values, 99) * 1e3),
            "n": len(values)} if values else {}


async def run(url: str, args) -> dict:
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await stream_one(client, KEYS["interactive"], "warm up", 4, Tally())
        now = time.time()
        start = (now // 60 + 1) * 60
        if start - now < args.alone_s:
            start += 60
        alone = Tally()

        def interactive(tally):
            return lambda seed: stream_one(client, KEYS["interactive"], words(args.short_words, seed),
                                           args.interactive_tokens, tally)

        await asyncio.gather(*(loop(start - 1, interactive(alone)) for _ in range(args.interactive_streams)))
        while time.time() < start:
            await asyncio.sleep(0.01)
        mixed, batch, over = Tally(), Tally(), Tally()
        end = start + args.mixed_s
        started = time.perf_counter()

        async def over_one(seed):
            if await whole_one(client, KEYS["over"], words(8, seed), args.over_tokens, over):
                await asyncio.sleep(args.over_retry_s)  # keep knocking: every answer past the limit must be a 429

        await asyncio.gather(
            *(loop(end, interactive(mixed)) for _ in range(args.interactive_streams)),
            *(loop(end, lambda seed: stream_one(client, KEYS["batch"], words(args.long_words, seed), args.batch_tokens,
                                                batch)) for _ in range(args.batch_streams)),
            *(loop(end, over_one) for _ in range(args.over_workers)))
        elapsed = time.perf_counter() - started
        metrics = (await client.get("/metrics")).text
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
        "batch": {"requests": batch.ok, "completion_tokens": batch.completion_tokens,
                  "completion_tokens_per_s": batch.completion_tokens / elapsed},
        "mixed_completion_tokens_per_s": (mixed.completion_tokens + batch.completion_tokens + over.completion_tokens)
        / elapsed,
        "over_limit": {"tpm": args.tpm, "admitted_tokens_in_window": admitted, "of_tpm": admitted / args.tpm,
                       "requests_in_window": len(window), "refused_in_window": sum(s == 429 for _, s, _ in window),
                       "admitted_after_first_refusal": ok_after_refusal},
        "metrics_requests": {"client": client_counts, "server": server_counts,
                             "equal": client_counts == server_counts},
        "metrics_refused": refused | {"equal": refused["client"] == refused["server"]},
        "mixed_s": elapsed,
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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tenants.toml"
        tenants_file(path, args.tpm)
        serve = [*([args.model] if args.model else []), "--threads", str(args.threads), "--tenants", str(path)]
        with ridgeline_server(*serve) as (url, _):
            result = asyncio.run(run(url, args))
    result["args"] = vars(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"{stamp}.json").write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    a, m = result["interactive_alone"], result["interactive_mixed"]
    print(f"interactive alone: TTFT p99 {a['ttft']['p99_ms']:.0f} ms, ITL p99 {a['itl']['p99_ms']:.1f} ms")
    print(f"interactive mixed: TTFT p99 {m['ttft']['p99_ms']:.0f} ms, ITL p99 {m['itl']['p99_ms']:.1f} ms "
          f"(x{result['ratio_p99_ttft']:.2f}, x{result['ratio_p99_itl']:.2f}; target <= 1.3)")
    o = result["over_limit"]
    print(f"over-limit tenant: {o['admitted_tokens_in_window']} of {o['tpm']} TPM admitted in one window "
          f"({o['of_tpm']:.1%}), {o['refused_in_window']} refused, {o['admitted_after_first_refusal']} admitted after "
          "its first refusal")
    print(f"batch: {result['batch']['completion_tokens_per_s']:.1f} tok/s; all: "
          f"{result['mixed_completion_tokens_per_s']:.1f} tok/s")
    print(f"/metrics equals the client's counts: requests {result['metrics_requests']['equal']}, "
          f"refusals {result['metrics_refused']['equal']}")


if __name__ == "__main__":
    main()
