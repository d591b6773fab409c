"""Load generator for any OpenAI-compatible server: streamed requests at fixed concurrency or Poisson arrivals.

Bounded twice: by the number of prompts and by a wall-clock limit per load level (requests still running
at the limit are cancelled and counted as failed). `--trace FILE` replays a trace (workload/trace.py: arrival times,
prompts as text or token ids, output lengths) instead, each request sent at its recorded arrival (no concurrency
cap unless `--concurrency` gives one, as `simulate` replays it); `--record FILE` writes what was sent, with what each
request measured, in that same format, so `ridgeline simulate` can replay it. Token counts come from the server's usage chunk
(`stream_options.include_usage`), falling back to one token per streamed chunk.
"""

import asyncio
import ipaddress
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ridgeline.workload.serve_metrics import RequestResult, Slo, summarise
from ridgeline.errors import RidgelineError
from ridgeline.workload.trace import TraceRequest, read_trace, write_trace

# Common English words: a prompt of N of them is roughly N tokens for most tokenizers.
FILLER_WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wise owls watch from old oak trees near "
    "quiet rivers under bright morning light and distant hills"
).split()


@dataclass(frozen=True)
class LoadLevel:
    concurrency: int | None = None  # at most this many requests in flight
    request_rate: float | None = None  # Poisson arrivals per second (None: send as fast as concurrency allows)

    @property
    def label(self) -> str:
        if self.request_rate is not None:
            return f"rate {self.request_rate:g}/s" + (f", max {self.concurrency} in flight" if self.concurrency else "")
        if self.concurrency is None:
            return "arrivals uncapped"  # a trace's own arrival times, nothing held back
        return f"concurrency {self.concurrency}"


@dataclass(frozen=True)
class BenchServeConfig:
    base_url: str
    model: str | None = None  # None: the first model the server lists
    endpoint: str = "completions"  # or "chat"
    num_prompts: int = 32
    input_len: int = 128
    output_len: int = 64
    dataset: Path | None = None  # JSONL with "prompt" (and optional "max_tokens") per line
    max_seconds: float = 300.0  # per load level
    ignore_eos: bool = True  # ask for exactly output_len tokens (a vLLM/llama.cpp/ridgeline extra)
    slo: Slo = Slo()
    allow_remote: bool = False
    seed: int = 0
    trace: Path | None = None  # replay these arrivals and prompts (overrides the synthetic ones and the rate)
    record: Path | None = None  # write the requests sent, with their measurements, as a trace


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int
    ids: tuple[int, ...] | None = None  # sent as the prompt instead of the text (completions only)
    arrival_s: float | None = None  # from a trace


def check_target(base_url: str, allow_remote: bool) -> None:
    """Refuse to load anything but this machine unless the user says otherwise."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RidgelineError(f"--base-url must look like http://127.0.0.1:8000, got {base_url!r}")
    if allow_remote:
        return
    host = parts.hostname
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise RidgelineError(f"{host} is not a loopback address: pass --allow-remote to load a remote server")


def make_prompts(config: BenchServeConfig) -> list[Prompt]:
    if config.trace is not None:
        rows = read_trace(config.trace)
        if any(row.prompt is None and row.prompt_ids is None for row in rows):
            raise RidgelineError(f"trace {config.trace}: a server needs each prompt as 'prompt' text or 'prompt_ids'")
        if config.endpoint == "chat" and any(row.prompt is None for row in rows):
            raise RidgelineError("token-id prompts need --endpoint completions")
        return [Prompt(row.prompt or "", row.output_tokens, row.prompt_ids, row.arrival_s) for row in rows]
    if config.dataset is None:
        rng = random.Random(config.seed)
        return [
            Prompt(" ".join(rng.choice(FILLER_WORDS) for _ in range(config.input_len)), config.output_len)
            for _ in range(config.num_prompts)
        ]
    try:
        lines = [line for line in Path(config.dataset).read_text().splitlines() if line.strip()]
        rows = [json.loads(line) for line in lines]
    except (OSError, json.JSONDecodeError) as error:
        raise RidgelineError(f"cannot read dataset {config.dataset}: {error}") from None
    if not rows or not all(isinstance(row, dict) and isinstance(row.get("prompt"), str) for row in rows):
        raise RidgelineError(f"dataset {config.dataset} needs one JSON object with a string 'prompt' per line")
    return [Prompt(row["prompt"], int(row.get("max_tokens", config.output_len))) for row in rows[: config.num_prompts]]


def request_body(config: BenchServeConfig, model: str, prompt: Prompt) -> dict:
    body = {
        "model": model,
        "max_tokens": prompt.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = list(prompt.ids) if prompt.ids is not None else prompt.text
    return body


def chunk_text(chunk: dict, endpoint: str) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if endpoint == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


async def send_request(client: httpx.AsyncClient, config: BenchServeConfig, model: str, prompt: Prompt) -> RequestResult:
    """One streamed request, timing every content chunk from the moment it is sent."""
    result = RequestResult(prompt=prompt.text)
    path = "/v1/chat/completions" if config.endpoint == "chat" else "/v1/completions"
    start = time.perf_counter()
    try:
        async with client.stream("POST", path, json=request_body(config, model, prompt)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                text = chunk_text(chunk, config.endpoint)
                if text:
                    now = time.perf_counter() - start
                    if not result.chunk_times_s:
                        result.ttft_s = now
                    result.chunk_times_s.append(now)
                    result.chunks += 1
                    result.text += text
                if chunk.get("usage"):
                    result.usage_prompt_tokens = chunk["usage"].get("prompt_tokens")
                    result.usage_completion_tokens = chunk["usage"].get("completion_tokens")
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        result.error = f"{type(error).__name__}: {error}"
        return result
    result.e2e_s = time.perf_counter() - start
    result.ok = bool(result.chunk_times_s)
    if not result.ok:
        result.error = "the stream ended without any content"
    return result


async def first_model(client: httpx.AsyncClient) -> str:
    try:
        response = await client.get("/v1/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as error:
        raise RidgelineError(f"could not list the server's models (pass --model): {error}") from None


async def run_level(
    config: BenchServeConfig, level: LoadLevel, on_done: Callable[[RequestResult], None] = lambda result: None
) -> dict:
    """Send every prompt at this load level; return the level's summary (see serve_metrics.summarise)."""
    prompts = make_prompts(config)
    in_flight = asyncio.Semaphore(level.concurrency or len(prompts))
    arrivals = random.Random(config.seed)
    results: dict[int, RequestResult] = {}
    limits = httpx.Limits(max_connections=level.concurrency or len(prompts))
    async with httpx.AsyncClient(base_url=config.base_url, timeout=config.max_seconds, limits=limits, trust_env=False) as client:
        model = config.model or await first_model(client)

        async def one(index: int, prompt: Prompt, delay_s: float) -> None:
            await asyncio.sleep(delay_s)
            held = in_flight.locked()  # the concurrency cap holds it back: it is sent later than it arrived
            async with in_flight:
                if held:
                    sent[index] = time.perf_counter() - start
                result = await send_request(client, config, model, prompt)
            results[index] = result
            on_done(result)

        delays, clock = [], 0.0
        for prompt in prompts:
            delays.append(clock if prompt.arrival_s is None else prompt.arrival_s)
            if level.request_rate:
                clock += arrivals.expovariate(level.request_rate)
        sent = dict(enumerate(delays))  # when each request went out: its arrival, unless the cap held it
        start = time.perf_counter()
        tasks = [asyncio.create_task(one(i, p, d)) for i, (p, d) in enumerate(zip(prompts, delays))]
        _, pending = await asyncio.wait(tasks, timeout=config.max_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        duration = time.perf_counter() - start
    for index in range(len(prompts)):
        results.setdefault(index, RequestResult(prompt="", error="cancelled at the time limit"))
    if config.record is not None:
        # The arrival recorded is when the request was sent, as the TTFT beside it is measured from then.
        record_trace(config.record, prompts, [sent[i] for i in range(len(prompts))],
                     [results[i] for i in range(len(prompts))])
    summary = summarise(list(results.values()), duration, config.slo)
    return {"load": {"concurrency": level.concurrency, "request_rate": level.request_rate}, "model": model} | summary


def record_trace(path: Path, prompts: list[Prompt], delays: list[float], results: list[RequestResult]) -> Path:
    """What was sent (a replayable trace) and, beside it on each line, what the request measured."""
    requests = [TraceRequest(delay, p.max_tokens, p.ids, p.text or None, r.usage_prompt_tokens)
                for p, delay, r in zip(prompts, delays, results)]
    measured = [{"ok": r.ok, "error": r.error or None, "ttft_s": r.ttft_s, "e2e_s": r.e2e_s,
                 "completion_tokens": r.output_tokens, "chunk_times_s": r.chunk_times_s} for r in results]
    return write_trace(path, requests, measured)


def roofline_points(levels: list[dict], config: BenchServeConfig) -> list[dict]:
    """Fixed-concurrency levels as decode points for `ridgeline roofline --measured` (a lower bound:
    the served output rate also pays for prefill and scheduling)."""
    points = []
    for level in levels:
        concurrency = level["load"]["concurrency"]
        if level["load"]["request_rate"] is None and concurrency and level["completed"]:
            points.append(
                {
                    "label": f"serve c={concurrency}",
                    "phase": "decode",
                    "batch": concurrency,
                    "context": config.input_len + config.output_len // 2,
                    "tokens_per_s": level["output_tokens_per_s"],
                }
            )
    return points


def bench_serve(
    config: BenchServeConfig, levels: list[LoadLevel], on_done: Callable[[RequestResult], None] = lambda result: None
) -> dict:
    """Run each load level in turn; the result is what `bench serve --json` prints."""
    check_target(config.base_url, config.allow_remote)
    if config.endpoint not in ("completions", "chat"):
        raise RidgelineError(f"--endpoint must be completions or chat, got {config.endpoint!r}")
    if config.record is not None and len(levels) > 1:
        raise RidgelineError("--record writes one trace: give one load level")
    if config.trace is not None and any(level.request_rate for level in levels):
        raise RidgelineError("--trace brings its own arrival times: drop --request-rate")
    started_at = time.time()
    results = [asyncio.run(run_level(config, level, on_done)) for level in levels]
    settings = asdict(config) | {key: str(getattr(config, key)) if getattr(config, key) else None
                                 for key in ("dataset", "trace", "record")}
    return {"config": settings, "started_at": started_at, "levels": results,
            "roofline_points": roofline_points(results, config)}


def fetch_steps_figure(base_url: str, since: float) -> dict | str:
    """The server's roofline figure of the steps it ran since `since` (a ridgeline server's /v1/steps/figure,
    the dashboard's picture), or why there is none (another server, or one that wants a key)."""
    try:
        response = httpx.get(f"{base_url}/v1/steps/figure", params={"since": since}, timeout=60)
    except httpx.HTTPError as error:
        return f"could not fetch {base_url}/v1/steps/figure: {error}"
    if response.status_code != 200:
        return f"{base_url}/v1/steps/figure answered HTTP {response.status_code} (not a ridgeline server, or it wants an API key)"
    return response.json()
