"""Two replicas of the default model behind the router, on this machine, in one run:

1. Prefix affinity: 8 shared system prompts x many user turns (4 in flight at a time), each replica's KV cache
   holding about 5 of the 8 prompts. Prefilled tokens and mean TTFT under the router's policy (cost: affinity +
   counted load) against round-robin. Target: >= 2x fewer prefilled tokens. `--copy-penalty 0` runs the policy
   as it was before copies of a held prefix were charged (greedy per-request cost), for comparison.
2. Uniform traffic (no shared prefixes): requests per replica; target: no replica above 1.3x another.
3. The router's own TTFT overhead: the same engine served by the one-model server, by the router app (engine
   in process), and the one-model server proxied through the router (OpenAI backend), sequential requests.
4. Failover under load: one replica killed with requests in flight; how they ended and where new ones went.

    python benchmarks/router_replicas.py [--requests 96] [--json out.json]
    python benchmarks/router_replicas.py --runs 5 --requests 64 --json out.json
        (part 1 only, five times over: every run's ratio; the router's own defaults, its rate prior included)
"""

import argparse
import asyncio
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from ridgeline.engine.options import engine_config
from ridgeline.cluster.errors import ReplicaFailed
from ridgeline.cluster.http_replica import HttpReplica
from ridgeline.cluster.local_replica import LocalReplica
from ridgeline.cluster import replica_policy
from ridgeline.cluster.messages import GenerateRequest
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.launcher import BackgroundServer
from ridgeline.server.router_app import create_router_app

WORDS = ("cache prefill decode token router replica memory bandwidth compute kernel batch queue latency model "
         "layer window page block hash").split()


def text(rng, words: int) -> str:
    return " ".join(rng.choice(WORDS, words))


MODEL: str | None = None  # --model; None: the bundled default model
SYSTEM_WORDS = 260
REPORT_INTERVAL_S = 1.0  # --report-interval-s: the router's default health interval (`ridgeline router`)
PRIOR_PREFILL: float | None = None  # --prior-prefill-tokens-per-s; None: the router's own prior (router_prior)


def make_engine(kv: str) -> LLMEngine:
    return LLMEngine(engine_config(MODEL, threads=1, kv_cache_memory=kv, max_num_seqs=16, max_num_batched_tokens=256))


async def run_workload(router: Router, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    semaphore = asyncio.Semaphore(concurrency)
    prefilled, ttfts = [], []

    async def one(i: int, prompt: list[int]) -> None:
        async with semaphore:
            started = time.perf_counter()
            first = None
            request = GenerateRequest(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            async for output in router.generate("gemma", request):
                if first is None:
                    first = time.perf_counter() - started
                last = output
            prefilled.append(len(prompt) - last.num_cached_tokens)
            ttfts.append(first)

    async def reports() -> None:  # the router's health checks, which carry the workers' reports
        while True:
            await router.probe_all()
            await asyncio.sleep(REPORT_INTERVAL_S)

    reporter = asyncio.create_task(reports())
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    reporter.cancel()
    sent = {name: router.loads.of(name).sent for name in router.replicas}
    return {"prefilled_tokens": sum(prefilled), "prompt_tokens": sum(map(len, prompts)),
            "mean_ttft_ms": round(1e3 * statistics.mean(ttfts), 1), "requests_per_replica": sent}


@functools.cache
def router_prior() -> Rates:
    """The rates the router starts from before it has measured any: what `ridgeline router` gives this model with
    no rates configured (cluster/build.py prior_rates: the roofline's, for this machine as `ridgeline measure`
    cached it, else its napkin estimate), unless --prior-prefill-tokens-per-s pins the prefill rate."""
    from ridgeline.cluster.rates import roofline_rates
    from ridgeline.machine.this_machine import roof_named
    from ridgeline.model.model_source import load_model_shape

    prior = roofline_rates(load_model_shape(MODEL), roof_named("this-machine"))
    if PRIOR_PREFILL is not None:
        return Rates(PRIOR_PREFILL, prior.decode_tokens_per_s, "configured")
    return prior


def router_over(replicas: list, policy: str) -> Router:
    group = ModelGroup("gemma", 0.5, replicas, tokenizer=getattr(replicas[0], "tokenizer", None),
                       admission=getattr(replicas[0], "admission", None))
    prior = router_prior()
    rates = {r.name: Rates(prior.prefill_tokens_per_s, prior.decode_tokens_per_s, prior.source) for r in replicas}
    return Router([group], rates, policy=policy, health_interval_s=3600)


def workloads(tokenizer, requests: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """(shared-prefix turns, uniform prompts) for one run."""
    rng = np.random.default_rng(seed)
    systems = [tokenizer.encode(f"System prompt {k}. " + text(rng, SYSTEM_WORDS)) for k in range(8)]
    shared = [systems[int(rng.integers(8))] + tokenizer.encode(" User: " + text(rng, 12), add_bos=False)
              for _ in range(requests)]
    uniform = [tokenizer.encode(text(rng, int(rng.integers(SYSTEM_WORDS // 13, SYSTEM_WORDS * 10 // 13))))
               for _ in range(requests)]
    return shared, uniform


async def shared_prefix_both(kv: str, shared: list[list[int]], engines: list[LLMEngine] | None = None) -> tuple[dict, list]:
    """The shared-prefix workload under `cost` then `round_robin`, each on cold caches."""
    results = {}
    for policy in ("cost", "round_robin"):
        if engines is None or policy != "cost":  # cold caches for each policy
            engines = [make_engine(kv) for _ in range(2)]
        replicas = [LocalReplica(f"gemma/{i}", "gemma", lambda e=e: e) for i, e in enumerate(engines)]
        router = router_over(replicas, policy)
        results[f"shared_prefix_{policy}"] = await run_workload(router, shared, 4, 8)
        for replica in replicas:
            replica.worker.stop()
    results["prefilled_ratio_round_robin_over_cost"] = round(
        results["shared_prefix_round_robin"]["prefilled_tokens"] / results["shared_prefix_cost"]["prefilled_tokens"], 2)
    return results, engines


async def repeated_runs(kv: str, requests: int, runs: int) -> dict:
    """The shared-prefix comparison `runs` times over (the same turns; the timing differs run to run)."""
    tokenizer = make_engine(kv).tokenizer
    shared, _ = workloads(tokenizer, requests)
    rows = []
    for run in range(runs):
        started = time.perf_counter()
        result, _ = await shared_prefix_both(kv, shared)
        result["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(result)
        print(json.dumps({"run": run + 1, "ratio": result["prefilled_ratio_round_robin_over_cost"],
                          "cost_prefilled": result["shared_prefix_cost"]["prefilled_tokens"],
                          "round_robin_prefilled": result["shared_prefix_round_robin"]["prefilled_tokens"]}), flush=True)
    ratios = [r["prefilled_ratio_round_robin_over_cost"] for r in rows]
    return {"runs": rows, "ratios": ratios, "min_ratio": min(ratios)}


async def affinity_and_uniform(kv: str, requests: int) -> dict:
    engines = [make_engine(kv) for _ in range(2)]
    shared, uniform = workloads(engines[0].tokenizer, requests)
    results, engines = await shared_prefix_both(kv, shared, engines)
    replicas = [LocalReplica(f"gemma/{i}", "gemma", lambda e=e: e) for i, e in enumerate(engines)]
    router = router_over(replicas, "cost")
    results["uniform_cost"] = await run_workload(router, uniform, 8, 8)
    for replica in replicas:
        replica.worker.stop()
    counts = list(results["uniform_cost"]["requests_per_replica"].values())
    results["uniform_max_over_min"] = round(max(counts) / max(1, min(counts)), 3)
    return results, engines


def ttft_series(url: str, model: str, n: int) -> list[float]:
    times = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(n):
            body = {"model": model, "prompt": f"Request {i}: the KV cache grows because", "max_tokens": 1,
                    "stream": True, "temperature": 0}
            started = time.perf_counter()
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        times.append(time.perf_counter() - started)
                        break
    return times


def ttft_overhead(engine: LLMEngine, n: int) -> dict:
    out = {}
    with BackgroundServer(create_app(engine, ServerConfig())) as direct:
        ttft_series(direct.url, engine.model_name, 3)
        out["direct_ms"] = 1e3 * statistics.median(ttft_series(direct.url, engine.model_name, n))

        async def proxied() -> Router:
            router = router_over([HttpReplica("gemma/http", "gemma", direct.url, engine.model_name)], "cost")
            await router.start()
            return router

        with BackgroundServer(create_router_app(proxied)) as front:
            ttft_series(front.url, "gemma", 3)
            out["via_router_http_backend_ms"] = 1e3 * statistics.median(ttft_series(front.url, "gemma", n))

    async def in_process() -> Router:
        router = router_over([LocalReplica("gemma/0", "gemma", lambda: engine)], "cost")
        await router.start()
        return router

    with BackgroundServer(create_router_app(in_process)) as front:
        ttft_series(front.url, "gemma", 3)
        out["via_router_in_process_ms"] = 1e3 * statistics.median(ttft_series(front.url, "gemma", n))
    out["overhead_in_process_ms"] = out["via_router_in_process_ms"] - out["direct_ms"]
    out["overhead_http_backend_ms"] = out["via_router_http_backend_ms"] - out["direct_ms"]
    return {k: round(v, 2) for k, v in out.items()}


async def failover(engines: list[LLMEngine]) -> dict:
    replicas = [LocalReplica(f"gemma/{i}", "gemma", lambda e=e: e) for i, e in enumerate(engines)]
    router = router_over(replicas, "cost")
    tokenizer = engines[0].tokenizer
    outcomes = {"failed_clean": 0, "finished": 0, "other": 0}

    async def one(i: int, max_tokens: int) -> None:
        request = GenerateRequest(f"f{i}", tokenizer.encode(f"Story {i}: once upon a time"),
                                  SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        try:
            async for _ in router.generate("gemma", request):
                pass
            outcomes["finished"] += 1
        except ReplicaFailed:
            outcomes["failed_clean"] += 1
        except Exception:  # noqa: BLE001 - counted, the point is that nothing else happens
            outcomes["other"] += 1

    started = time.perf_counter()
    tasks = [asyncio.create_task(one(i, 64)) for i in range(8)]
    await asyncio.sleep(1.0)
    replicas[0].kill("benchmark killed replica 0")
    survivor_before = router.loads.of("gemma/1").sent
    after = [asyncio.create_task(one(100 + i, 8)) for i in range(4)]
    await asyncio.wait_for(asyncio.gather(*tasks, *after), 300)
    for replica in replicas:
        replica.worker.stop()
    return {**outcomes, "new_requests": 4,
            "new_requests_to_survivor": router.loads.of("gemma/1").sent - survivor_before,
            "seconds": round(time.perf_counter() - started, 2)}


def main() -> None:
    global MODEL, SYSTEM_WORDS, REPORT_INTERVAL_S, PRIOR_PREFILL
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--ttft-requests", type=int, default=20)
    parser.add_argument("--kv", default="24MiB", help="KV cache per replica (about 5 of the 8 system prompts)")
    parser.add_argument("--model", help="GGUF file (default: the bundled model)")
    parser.add_argument("--system-words", type=int, default=SYSTEM_WORDS, help="words per shared system prompt")
    parser.add_argument("--copy-penalty", type=float, default=replica_policy.COPY_PENALTY,
                        help="the replica policy's charge for copying a held prefix (0: the greedy per-request cost)")
    parser.add_argument("--report-interval-s", type=float, default=REPORT_INTERVAL_S,
                        help="seconds between the workers' reports to the router (its health checks; default: the "
                             "router's default)")
    parser.add_argument("--prior-prefill-tokens-per-s", type=float, default=PRIOR_PREFILL,
                        help="the prefill rate the router starts from before it has measured any (default: the "
                             "router's own prior, the roofline's for this model on this machine)")
    parser.add_argument("--affinity-only", action="store_true", help="run part 1 (and 2) only")
    parser.add_argument("--runs", type=int, default=1,
                        help="> 1: part 1 only, this many times over, each ratio recorded (in --json)")
    parser.add_argument("--machine", default="AMD EPYC, 2 shared cores", help="what the JSON says it ran on")
    parser.add_argument("--json")
    args = parser.parse_args()
    MODEL, SYSTEM_WORDS = args.model, args.system_words
    REPORT_INTERVAL_S, PRIOR_PREFILL = args.report_interval_s, args.prior_prefill_tokens_per_s
    replica_policy.COPY_PENALTY = args.copy_penalty
    router_prior()  # before the thread count drops to the replicas' one: `ridgeline router` draws it at its own
    torch.set_num_threads(1)
    if args.runs > 1:
        repeated = asyncio.run(repeated_runs(args.kv, args.requests, args.runs))
        prior = router_prior()
        settings = {"requests": args.requests, "kv": args.kv, "report_interval_s": REPORT_INTERVAL_S,
                    "prior_prefill_tokens_per_s": round(prior.prefill_tokens_per_s, 1),
                    "prior_decode_tokens_per_s": round(prior.decode_tokens_per_s, 1), "prior_source": prior.source,
                    "copy_penalty": args.copy_penalty, "machine": args.machine}
        print(json.dumps({"ratios": repeated["ratios"], "min_ratio": repeated["min_ratio"]}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"settings": settings, **repeated}, indent=2))
        return
    affinity, engines = asyncio.run(affinity_and_uniform(args.kv, args.requests))
    print(engines[0].capacity_report, file=sys.stderr)
    results = {"copy_penalty": args.copy_penalty, "affinity": affinity}
    print(json.dumps(results["affinity"], indent=1), flush=True)
    if args.affinity_only:
        return
    results["ttft"] = ttft_overhead(engines[0], args.ttft_requests)
    print(json.dumps(results["ttft"]), flush=True)
    results["failover"] = asyncio.run(failover(engines))
    print(json.dumps(results["failover"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
