"""Disaggregated serving under a burst of clients: is every request answered, or refused up front, and never lost?

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/disagg_load.py --json out.json [--ray | --router-fronts 2] [--requests 200]

Starts `ridgeline serve --role prefill` and `--role decode` (--threads 1 each, --kv-cache-memory 512MiB by default)
behind `ridgeline proxy` (or, with --ray, `ridgeline serve --prefill-workers 1 --decode-workers 1`; with
--router-fronts N, N such proxy fronts behind one `ridgeline router` whose config lists each as an `openai` replica
of one model; or uses --url), then sends --requests streamed /v1/completions, --concurrency in flight at once,
prompts of 1 to --max-words words and max_tokens 4, 32 or 128 (all drawn from --seed), every client reading its
stream to the end (or, with --leave-fraction, some leaving after their first event). Before the load, a fixed probe set is answered greedily
(the same before and after a change: --json keeps the texts).

Each request ends as one of: complete (200, a finish_reason, [DONE]); refused (429/503 with Retry-After, before any
byte); refused_no_retry_after (429/503 without it); client_error (any 4xx: a valid request refused -- must be 0);
server_error (another status); error_event (200, then an error in the stream); cut (200, the stream ended without
[DONE]); left (the client itself left early, by design). Re-prefills are counted from the front's
`x-ridgeline-reprefills` header and compared with the front's /metrics (`ridgeline_front_reprefills_total`), as are
refusals (`ridgeline_front_refusals_total`); through the router, also its own counts: requests relayed whole
(`ridgeline_router_requests_total{outcome="ok"}`) against the client's 200s, requests it refused with 429/503
(`ridgeline_router_refusals_total`) against the client's refusals.
"""

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disagg_vs_colocated import start  # noqa: E402

from ridgeline.bench.bench_serve import FILLER_WORDS  # noqa: E402

PROBES = ["Hello", "The capital of France is", "Write one sentence about the sea. " * 12,
          " ".join(FILLER_WORDS) * 4, "Count: one two three four five six seven eight nine ten " * 10]


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(count))


def requests(args: argparse.Namespace) -> list[tuple[str, int]]:
    rng = random.Random(args.seed)
    choices = tuple(int(m) for m in args.max_tokens.split(","))
    return [(words(rng.randint(1, args.max_words), rng), rng.choice(choices)) for _ in range(args.requests)]


async def probe(client: httpx.AsyncClient, model: str) -> list[str]:
    texts = []
    for prompt in PROBES:
        answer = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 24,
                                                            "temperature": 0})
        answer.raise_for_status()
        texts.append(answer.json()["choices"][0]["text"])
    return texts


async def one(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, leave: bool) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    sent = time.perf_counter()
    result: dict = {"max_tokens": max_tokens}
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            result["status"] = response.status_code
            result["reprefills"] = int(response.headers.get("x-ridgeline-reprefills", 0))
            if response.status_code != 200:
                result["retry_after"] = response.headers.get("retry-after")
                result["body"] = (await response.aread()).decode(errors="replace")[:300]
                result["outcome"] = ("client_error" if 400 <= response.status_code < 500 and response.status_code != 429
                                     else ("refused" if result["retry_after"] else "refused_no_retry_after")
                                     if response.status_code in (429, 503) else "server_error")
                return result
            finish, done, error, tokens = None, False, None, 0
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    error = event["error"]
                    continue
                if "ttft_s" not in result:
                    result["ttft_s"] = time.perf_counter() - sent
                    if leave:
                        result["outcome"] = "left"
                        return result
                for choice in event.get("choices", []):
                    tokens += 1
                    finish = choice.get("finish_reason") or finish
            result["e2e_s"] = time.perf_counter() - sent
            result["events"] = tokens
            result["outcome"] = ("error_event" if error is not None else "complete" if done and finish else "cut")
            if error is not None:
                result["body"] = json.dumps(error)[:300]
    except httpx.HTTPError as failure:
        result["outcome"] = "connection_error"
        result["body"] = repr(failure)[:300]
    return result


def counter(metrics_text: str, name: str, label: str = "") -> float:
    """The sum of `name` over its series (those whose labels include `label`, if given)."""
    return sum(float(line.split()[-1]) for line in metrics_text.splitlines()
               if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line)


ROUTED_MODEL = "pd"  # the model the router's config names its P/D fronts under


async def scrape(urls: list[str]) -> str:
    """The /metrics of every one of `urls`, one text (counter() sums a name over all of them)."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        return "\n".join([(await client.get(f"{url}/metrics")).text for url in urls])


async def run(url: str, args: argparse.Namespace, fronts: list[str] | None = None) -> dict:
    """`fronts`: the disaggregated fronts whose /metrics count re-prefills and refusals (default: `url` itself);
    given, `url` is a router over them, and its own counts are compared too."""
    routed = fronts is not None
    fronts = fronts if routed else [url]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0), limits=limits) as client:
        # (the router lists its virtual model `auto` first: name the fronts' model)
        model = ROUTED_MODEL if routed else (await client.get("/v1/models")).json()["data"][0]["id"]
        probes = await probe(client, model)
        before = await scrape(fronts)
        router_before = (await client.get("/metrics")).text if routed else ""
        gate = asyncio.Semaphore(args.concurrency)
        rng = random.Random(args.seed + 1)
        leaving = [rng.random() < args.leave_fraction for _ in range(args.requests)]

        async def gated(index: int, prompt: str, max_tokens: int) -> dict:
            async with gate:
                return await one(client, model, prompt, max_tokens, leaving[index])

        started = time.perf_counter()
        results = await asyncio.gather(*(gated(i, p, m) for i, (p, m) in enumerate(requests(args))))
        seconds = time.perf_counter() - started
        await asyncio.sleep(1.0)
        after = await scrape(fronts)
        router_after = (await client.get("/metrics")).text if routed else ""
    outcomes = collections.Counter(r["outcome"] for r in results)
    statuses = collections.Counter(r.get("status", "none") for r in results)
    client_reprefills = sum(r.get("reprefills", 0) for r in results)
    client_refusals = sum(1 for r in results if r.get("status") in (429, 503))
    summary = {
        "requests": len(results), "concurrency": args.concurrency, "seconds": round(seconds, 1),
        "outcomes": dict(outcomes), "statuses": {str(k): v for k, v in statuses.items()},
        "answered_4xx": sum(1 for r in results if isinstance(r.get("status"), int) and 400 <= r["status"] < 500
                            and r["status"] != 429),
        "client_reprefills": client_reprefills, "client_refusals": client_refusals,
        "front_reprefills": counter(after, "ridgeline_front_reprefills_total")
        - counter(before, "ridgeline_front_reprefills_total"),
        "front_refusals": counter(after, "ridgeline_front_refusals_total")
        - counter(before, "ridgeline_front_refusals_total"),
        "front_handoff_waits": counter(after, "ridgeline_front_handoff_waits_total")
        - counter(before, "ridgeline_front_handoff_waits_total"),
        "front_refusals_by_reason": {line.split('"')[1]: float(line.split()[-1]) for line in after.splitlines()
                                     if line.startswith("ridgeline_front_refusals_total{")},
        "probes": probes,
        "examples": {outcome: next(r.get("body") for r in results if r["outcome"] == outcome)
                     for outcome in outcomes if outcome not in ("complete", "left")},
    }
    if routed:
        def routed_count(name: str, label: str = "") -> float:
            return counter(router_after, name, label) - counter(router_before, name, label)

        summary["fronts"] = len(fronts)
        summary["client_200s"] = sum(1 for r in results if r.get("status") == 200)
        summary["router_ok"] = routed_count("ridgeline_router_requests_total", 'outcome="ok"')
        summary["router_refusals"] = routed_count("ridgeline_router_refusals_total")
        summary["router_failovers"] = routed_count("ridgeline_router_failovers_total")
    ttfts = sorted(r["ttft_s"] for r in results if "ttft_s" in r)
    if ttfts:
        summary["ttft_s_p50_p99"] = [round(ttfts[len(ttfts) // 2], 2), round(ttfts[int(len(ttfts) * 0.99)], 2)]
    return summary


def start_front(args: argparse.Namespace, model: list[str], name: str = "load") -> tuple[list, str, str]:
    """A prefill and a decode worker (--threads 1 each) and `ridgeline proxy` over them: (processes, the proxy's
    URL, the decode worker's URL)."""
    decode_kv = args.decode_kv_cache_memory or args.kv_cache_memory
    processes = []
    prefill, prefill_url = start(["serve", *model, "--role", "prefill", "--threads", "1", "--kv-cache-memory",
                                  args.kv_cache_memory], log_name=f"{name}-prefill")
    processes.append(prefill)
    decode, decode_url = start(["serve", *model, "--role", "decode", "--threads", "1", "--kv-cache-memory",
                                decode_kv, *args.decode_args.split()], log_name=f"{name}-decode")
    processes.append(decode)
    proxy, url = start(["proxy", "--prefill", prefill_url, "--decode", decode_url, *args.proxy_args.split()],
                       log_name=f"{name}-proxy")
    processes.append(proxy)
    return processes, url, decode_url


def router_config(fronts: list[str], served_name: str, directory: Path) -> Path:
    """A router config listing each P/D front as one `openai` replica of ROUTED_MODEL."""
    path = directory / "router.toml"
    path.write_text("[router]\nhealth_interval_s = 1.0\n" + "".join(
        f'\n[[backend]]\nmodel = "{ROUTED_MODEL}"\nkind = "openai"\nurl = "{url}"\nserved_name = "{served_name}"\n'
        for url in fronts))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="an endpoint already running (default: start one)")
    parser.add_argument("--ray", action="store_true", help="workers on Ray (serve --prefill-workers/--decode-workers)")
    parser.add_argument("--router-fronts", type=int, default=0, help="this many P/D fronts (proxy + prefill + decode "
                        "worker each) behind `ridgeline router`, the load sent to the router (0: to one front)")
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--max-words", type=int, default=900)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--max-tokens", default="4,32,128", help="each request's max_tokens, drawn from these")
    parser.add_argument("--leave-fraction", type=float, default=0.0)
    parser.add_argument("--kv-cache-memory", default="512MiB", help="each worker's")
    parser.add_argument("--decode-kv-cache-memory", default=None, help="the decode worker's, if not --kv-cache-memory")
    parser.add_argument("--proxy-args", default="", help="extra `ridgeline proxy` options, space-separated (with "
                        "--ray: given to `serve`, e.g. --handoff-wait 0)")
    parser.add_argument("--decode-args", default="", help="extra options of the decode worker, space-separated (with "
                        "--ray: given to `serve`, e.g. --max-kv-waiting 4)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = ["--model", args.model] if args.model else []
    processes = []
    try:
        fronts = None
        if args.url:
            url = args.url
        elif args.router_fronts:
            fronts = []
            for index in range(args.router_fronts):
                started, front_url, _ = start_front(args, model, f"routed{index}")
                processes.extend(started)
                fronts.append(front_url)
            served_name = httpx.get(f"{fronts[0]}/v1/models", timeout=60).json()["data"][0]["id"]
            config = router_config(fronts, served_name, Path(tempfile.mkdtemp(prefix="disagg-load-router-")))
            router, url = start(["router", str(config)], log_name="routed-router")
            processes.append(router)
        elif args.ray:
            # serve on Ray takes the front's options and the decode workers' (one HandoffConfig): both lists go to it
            decode_kv = ["--decode-kv-cache-memory", args.decode_kv_cache_memory] if args.decode_kv_cache_memory else []
            process, url = start(["serve", *model, "--prefill-workers", "1", "--decode-workers", "1", "--threads", "1",
                                  "--kv-cache-memory", args.kv_cache_memory, *decode_kv, *args.proxy_args.split(),
                                  *args.decode_args.split()], log_name="ray-front")
            processes.append(process)
        else:
            started, url, decode_url = start_front(args, model)
            processes.extend(started)
        summary = asyncio.run(run(url, args, fronts))
        if not args.url and not args.ray and not args.router_fronts:  # the decode worker's KV, for how many requests' pages it holds
            metrics = httpx.get(f"{decode_url}/metrics", timeout=60).text
            summary["decode_kv_pages"] = counter(metrics, "ridgeline_kv_cache_total_pages")
            summary["decode_kv_transfers_failed"] = counter(metrics, "ridgeline_kv_transfers_failed_total")
    finally:
        for process in processes:
            process.kill()
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
