"""A disconnect storm behind the disaggregated front and the router: does work nobody waits for stop (issue 38)?

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/abort_storm.py --json out.json

Two deployments on the default model, each worker `ridgeline serve --threads 1`: `ridgeline proxy` over
`serve --role prefill` and `--role decode`, then `ridgeline router` over two colocated replicas (`kind = "openai"`
entries of one model, so each replica is a process whose /metrics can be read). Each gets:

1. A storm (from --seed): --requests streamed completions of --min-words to --max-words words, --concurrency at
   once. A third are cut after 0-10 events; --abandon-fraction are abandoned by a --abandon-timeout client
   timeout; the rest read to the end but give up after --patience seconds (a user's client does not wait
   forever). A thread scrapes every process's /metrics every --scrape-every seconds throughout.
2. After the last client has left: the seconds until every worker reports 0 running, 0 waiting, every KV page
   free, no pages held for a decode worker and none waiting for a transfer; the workers' count of prefills
   computed for clients already gone (ridgeline_prefills_for_gone_clients_total) against the clients that left
   before their first token (those whose prefill could have been spent for nobody); the slowest scrape.
3. Greedy probes before and after, which must be the same.
4. A second storm of patient clients, and SIGTERM to the front (the router) --sigterm-after seconds into it, with
   --drain-timeout: how long the process took to exit, how every request ended (complete, or an explicit 503 /
   error event shutting_down; "cut" is a connection that ended with neither), and whether the workers behind were
   left idle (no page held on the peer).
"""

import argparse
import asyncio
import collections
import json
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disagg_vs_colocated import start  # noqa: E402

from ridgeline.bench.bench_serve import FILLER_WORDS  # noqa: E402

PROBES = ["Hello", "The capital of France is", "Write one sentence about the sea. " * 12,
          "Count: one two three four five six seven eight nine ten " * 10]
SETTLE_LIMIT = 60.0  # seconds the workers get to go idle before the run says they did not


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(count))


def sample(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = name.split("{")[0]
            values[name] = values.get(name, 0.0) + float(value)
    return values


class Scraper(threading.Thread):
    """Scrapes every URL's /metrics every `every` seconds on a thread of its own (the storm's event loop is busy),
    keeping each one's slowest answer."""

    def __init__(self, urls: list[str], every: float):
        super().__init__(daemon=True)
        self.urls, self.every = urls, every
        self.slowest = {url: 0.0 for url in urls}
        self.failed = {url: 0 for url in urls}
        self.count = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                for url in self.urls:
                    began = time.perf_counter()
                    try:
                        client.get(f"{url}/metrics").raise_for_status()
                    except httpx.HTTPError:
                        self.failed[url] += 1
                    self.slowest[url] = max(self.slowest[url], time.perf_counter() - began)
                    self.count += 1
                self.stop.wait(self.every)


def worker_state(url: str) -> dict:
    m = sample(httpx.get(f"{url}/metrics", timeout=30).text)
    kv_waiting = httpx.post(f"{url}/v1/kv/lookup", json={"prompt": "x"}, timeout=30).json()["kv_waiting"]
    return {"running": m["ridgeline_num_requests_running"], "waiting": m["ridgeline_num_requests_waiting"],
            "pages_in_use": m["ridgeline_kv_cache_total_pages"] - m["ridgeline_kv_cache_free_pages"],
            "held_for_decode": m["ridgeline_kv_held_requests"], "waiting_for_kv": kv_waiting,
            "prefills_for_gone_clients": m.get("ridgeline_prefills_for_gone_clients_total", 0.0),
            "client_left": m.get("ridgeline_requests_client_left_total", 0.0)}


def idle(state: dict) -> bool:
    return not any(state[k] for k in ("running", "waiting", "pages_in_use", "held_for_decode", "waiting_for_kv"))


def settle(workers: list[str]) -> tuple[float | None, dict]:
    """Seconds until every worker is idle (None: not within SETTLE_LIMIT), and their last states."""
    began = time.perf_counter()
    while True:
        states = {url: worker_state(url) for url in workers}
        if all(idle(s) for s in states.values()):
            return time.perf_counter() - began, states
        if time.perf_counter() - began > SETTLE_LIMIT:
            return None, states
        time.sleep(0.05)


async def probe(client: httpx.AsyncClient, model: str) -> list[str]:
    texts = []
    for prompt in PROBES:
        answer = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 16,
                                                            "temperature": 0})
        answer.raise_for_status()
        texts.append(answer.json()["choices"][0]["text"])
    return texts


async def one(client: httpx.AsyncClient, body: dict, behaviour: str, cut_after: int, args) -> dict:
    """One client. behaviour: cut (leaves after `cut_after` events), abandon (a client timeout), patient (reads
    to the end, gives up after --patience)."""
    result = {"behaviour": behaviour, "first_token": False}

    async def read() -> None:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            result["status"] = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                try:
                    result["code"] = json.loads(text)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    result["code"] = None
                result["outcome"] = "refused"
                return
            events, last, done = 0, None, False
            if behaviour == "cut" and cut_after == 0:
                result["outcome"] = "left"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                last = json.loads(line[6:])
                if "error" in last:
                    continue
                events += 1
                result["first_token"] = True
                if behaviour == "cut" and events >= cut_after:
                    result["outcome"] = "left"
                    return
            if last is not None and "error" in last:
                result["outcome"], result["code"] = "error_event", last["error"].get("code")
            else:
                result["outcome"] = "complete" if done else "cut"

    limit = args.abandon_timeout if behaviour == "abandon" else args.patience if behaviour == "patient" else None
    try:
        await asyncio.wait_for(read(), limit)
    except TimeoutError:
        result["outcome"] = "left"  # abandoned, or gave up waiting
    except httpx.HTTPError as error:
        result["outcome"], result["error"] = "cut", repr(error)[:200]
    result["ended"] = time.perf_counter()
    return result


def storm_plan(args, seed: int, count: int, patient_only: bool = False) -> list[tuple[dict, str, int]]:
    rng = random.Random(seed)
    plan = []
    for _ in range(count):
        body = {"prompt": words(rng.randint(args.min_words, args.max_words), rng),
                "max_tokens": rng.randint(16, args.max_tokens), "temperature": 0, "stream": True}
        draw = rng.random()
        behaviour = ("patient" if patient_only else "cut" if draw < 1 / 3
                     else "abandon" if draw < 1 / 3 + args.abandon_fraction else "patient")
        plan.append((body, behaviour, rng.randint(0, 10)))
    return plan


async def storm(url: str, model: str, plan, args) -> list[dict]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:
        gate = asyncio.Semaphore(args.concurrency)

        async def gated(body, behaviour, cut_after):
            async with gate:
                return await one(client, {**body, "model": model}, behaviour, cut_after, args)

        return await asyncio.gather(*(gated(*each) for each in plan))


def deployment_run(name: str, url: str, workers: list[str], front: str, args, seed: int) -> dict:
    model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][-1]["id"]

    async def probes() -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            return await probe(client, model)

    before = asyncio.run(probes())
    gone_before = sum(worker_state(w)["prefills_for_gone_clients"] for w in workers)
    scraper = Scraper([front, *workers], args.scrape_every)
    scraper.start()
    began = time.perf_counter()
    results = asyncio.run(storm(url, model, storm_plan(args, seed, args.requests), args))
    last_left = max(r["ended"] for r in results)
    settle_s, states = settle(workers)
    since_last = None if settle_s is None else round(time.perf_counter() - last_left - 0, 3)
    scraper.stop.set()
    scraper.join()
    after = asyncio.run(probes())
    left = [r for r in results if r["outcome"] == "left"]
    return {
        "deployment": name, "requests": len(results), "storm_seconds": round(last_left - began, 1),
        "outcomes": dict(collections.Counter(r["outcome"] for r in results)),
        "behaviours": dict(collections.Counter(r["behaviour"] for r in results)),
        "refusal_codes": dict(collections.Counter(str(r.get("code")) for r in results if r["outcome"] == "refused")),
        "clients_left": len(left),
        "clients_left_before_first_token": sum(not r["first_token"] for r in left),
        "idle_seconds_after_last_client_left": since_last,
        "worker_states_at_end": states,
        "prefills_for_gone_clients": sum(s["prefills_for_gone_clients"] for s in states.values()) - gone_before,
        "max_scrape_seconds": {u: round(s, 3) for u, s in scraper.slowest.items()},
        "scrapes": scraper.count, "scrape_failures": scraper.failed,
        "probes_before": before, "probes_after": after, "greedy_unchanged": before == after,
    }


def sigterm_run(name: str, process, url: str, workers: list[str], args, seed: int) -> dict:
    model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][-1]["id"]
    plan = storm_plan(args, seed, args.sigterm_requests, patient_only=True)
    signalled = {}

    async def with_sigterm() -> list[dict]:
        async def signal_later() -> None:
            await asyncio.sleep(args.sigterm_after)
            signalled["at"] = time.perf_counter()
            process.send_signal(signal.SIGTERM)
            signalled["exit_s"] = await asyncio.to_thread(process_exit_seconds, process, signalled["at"])

        results, _ = await asyncio.gather(storm(url, model, plan, args), signal_later())
        return results

    results = asyncio.run(with_sigterm())
    settle_s, states = settle(workers)
    outcomes = collections.Counter((r["outcome"], r.get("code")) for r in results)
    return {
        "deployment": name, "requests": len(results), "drain_timeout": args.drain_timeout,
        "sigterm_after_seconds": args.sigterm_after, "exit_seconds_after_sigterm": signalled.get("exit_s"),
        "exit_code": process.returncode,
        "outcomes": {f"{o}{'' if c is None else ':' + c}": n for (o, c), n in outcomes.items()},
        "cut": sum(1 for r in results if r["outcome"] == "cut"),
        "workers_idle_seconds_after": None if settle_s is None else round(settle_s, 3),
        "worker_states_after": states,
    }


def process_exit_seconds(process, since: float) -> float | None:
    try:
        process.wait(timeout=120)
    except Exception:  # noqa: BLE001 - did not exit: reported as None, killed after
        return None
    return round(time.perf_counter() - since, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=96)
    parser.add_argument("--min-words", type=int, default=10)
    parser.add_argument("--max-words", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=128, help="each request's max_tokens: 16 to this")
    parser.add_argument("--abandon-fraction", type=float, default=0.15)
    parser.add_argument("--abandon-timeout", type=float, default=0.3)
    parser.add_argument("--patience", type=float, default=20.0, help="a patient client gives up after this")
    parser.add_argument("--scrape-every", type=float, default=0.25)
    parser.add_argument("--sigterm-requests", type=int, default=64)
    parser.add_argument("--sigterm-after", type=float, default=3.0)
    parser.add_argument("--drain-timeout", type=float, default=5.0)
    parser.add_argument("--kv-cache-memory", default="512MiB", help="each worker's")
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--only", choices=("proxy", "router"), default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = [args.model] if args.model else []
    worker = ["--threads", "1", "--kv-cache-memory", args.kv_cache_memory]
    drain = ["--drain-timeout", str(args.drain_timeout)]
    summary: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    processes = []
    try:
        if args.only in (None, "proxy"):
            prefill, prefill_url = start(["serve", *model, "--role", "prefill", *worker], log_name="storm-prefill")
            decode, decode_url = start(["serve", *model, "--role", "decode", *worker], log_name="storm-decode")
            proxy, url = start(["proxy", "--prefill", prefill_url, "--decode", decode_url, *drain],
                               log_name="storm-proxy")
            processes += [prefill, decode, proxy]
            workers = [prefill_url, decode_url]
            summary["proxy_storm"] = deployment_run("proxy", url, workers, url, args, args.seed)
            print(json.dumps(summary["proxy_storm"], indent=1), flush=True)
            summary["proxy_sigterm"] = sigterm_run("proxy", proxy, url, workers, args, args.seed + 1)
            print(json.dumps(summary["proxy_sigterm"], indent=1), flush=True)
            for process in (prefill, decode):
                process.kill()
        if args.only in (None, "router"):
            first, first_url = start(["serve", *model, *worker], log_name="storm-replica-0")
            second, second_url = start(["serve", *model, *worker], log_name="storm-replica-1")
            processes += [first, second]
            config = Path(tempfile.mkdtemp()) / "router.toml"
            config.write_text("".join(f'[[backend]]\nmodel = "m"\nkind = "openai"\nurl = "{u}"\n'
                                      f'served_name = "{httpx.get(u + "/v1/models").json()["data"][0]["id"]}"\n\n'
                                      for u in (first_url, second_url)))
            router, url = start(["router", str(config), *drain], log_name="storm-router")
            processes.append(router)
            workers = [first_url, second_url]
            summary["router_storm"] = deployment_run("router", url, workers, url, args, args.seed + 2)
            print(json.dumps(summary["router_storm"], indent=1), flush=True)
            summary["router_sigterm"] = sigterm_run("router", router, url, workers, args, args.seed + 3)
            print(json.dumps(summary["router_sigterm"], indent=1), flush=True)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
