"""Bounded soak: 64 concurrent streaming clients, 200+ requests on loopback, within a time limit.
Zero errors, zero leaked KV blocks, and bounded RSS growth between two identical rounds."""

import asyncio
import random
import time

import httpx
import openai

from server_helpers import serve_tiny_model
from test_server_disconnect import scrape

CLIENTS, REQUESTS, TIME_LIMIT_S = 64, 512, 120.0
# A second round of 512 requests on a warm server must not grow the process by more than this: a leak of
# even 128 KiB per request (a kept prompt, a logprobs list, a detokeniser) would show as 64 MiB.
RSS_GROWTH_LIMIT_MIB = 64


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def soak(url: str) -> dict:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    model = (await client.models.list()).data[0].id
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(REQUESTS):
        queue.put_nowait(i)
    done, tokens = 0, 0

    async def worker(worker_id: int) -> None:
        nonlocal done, tokens
        rng = random.Random(worker_id)
        while not queue.empty():
            i = queue.get_nowait()
            max_tokens = rng.randint(4, 24)
            prompt = f"request {i}: " + " ".join(rng.choice(["fox", "dog", "cache", "server", "prompt"]) for _ in range(rng.randint(4, 40)))
            stream = await client.completions.create(
                model=model, prompt=prompt, max_tokens=max_tokens, stream=True, temperature=rng.choice([0.0, 0.8]),
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            )
            finish, usage = None, None
            async for chunk in stream:
                if chunk.choices:
                    finish = chunk.choices[0].finish_reason or finish
                usage = chunk.usage or usage
            assert finish == "length" and usage.completion_tokens == max_tokens, (finish, usage)
            done += 1
            tokens += usage.completion_tokens

    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(CLIENTS))), TIME_LIMIT_S)
    elapsed = time.monotonic() - started
    async with httpx.AsyncClient(base_url=url) as http:
        final = scrape((await http.get("/metrics")).text)
    await client.close()
    return {"done": done, "tokens": tokens, "elapsed": elapsed, "metrics": final}


def test_soak_64_concurrent_streams(record_property):
    with serve_tiny_model(max_num_seqs=CLIENTS, num_blocks=1024, max_waiting=CLIENTS) as server:
        asyncio.run(soak(server.url))  # warm-up, so that RSS growth is measured on a steady state
        rss_before = rss_bytes()
        result = asyncio.run(soak(server.url))
        rss_after = rss_bytes()
    final = result["metrics"]
    assert result["done"] == REQUESTS
    assert final["ridgeline_request_success_total:length"] == 2 * REQUESTS
    assert final.get("ridgeline_request_success_total:abort", 0) == 0
    assert final["ridgeline_kv_cache_free_pages"] == final["ridgeline_kv_cache_total_pages"]
    assert final["ridgeline_num_requests_running"] == final["ridgeline_num_requests_waiting"] == 0
    growth_mib = (rss_after - rss_before) / 2**20
    record_property("rss_growth_mib", round(growth_mib, 1))
    record_property("output_tokens_per_s", round(result["tokens"] / result["elapsed"], 1))
    print(f"soak: {REQUESTS} requests, {result['tokens']} tokens in {result['elapsed']:.1f} s; RSS growth {growth_mib:+.1f} MiB")
    assert growth_mib < RSS_GROWTH_LIMIT_MIB
