"""A client that disconnects mid-stream aborts its request at once and its KV blocks return to the pool,
while the other streams carry on and finish intact."""

import asyncio
import json

import httpx

from server_helpers import serve_tiny_model

STREAMS, DROPPED, KEPT_TOKENS, CHUNKS_BEFORE_DROP = 8, 4, 300, 5


def scrape(text: str) -> dict[str, float]:
    """Metric values by name, labels dropped except finished_reason (one model per server)."""
    values = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{")[0]
        if 'finished_reason="' in name_labels:
            name += ":" + name_labels.split('finished_reason="')[1].split('"')[0]
        values[name] = float(value)
    return values


async def metrics(client: httpx.AsyncClient) -> dict[str, float]:
    return scrape((await client.get("/metrics")).text)


async def scenario(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        all_started = asyncio.Barrier(STREAMS + 1)
        drop_now = asyncio.Event()

        async def stream(index: int) -> dict:
            drops = index < DROPPED
            body = {
                "prompt": f"stream {index}: the quick brown fox jumps over the lazy dog",
                "max_tokens": KEPT_TOKENS,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            chunks, text, finish, usage = 0, "", None, None
            async with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    assert "error" not in chunk, chunk
                    if chunk["choices"]:
                        chunks += 1
                        text += chunk["choices"][0]["text"]
                        finish = chunk["choices"][0]["finish_reason"] or finish
                    usage = chunk.get("usage") or usage
                    if chunks == CHUNKS_BEFORE_DROP:
                        await all_started.wait()
                        if drops:
                            await drop_now.wait()
                            return {"dropped": True}  # leaving the block closes the connection mid-stream
            return {"dropped": False, "finish": finish, "usage": usage, "text": text}

        tasks = [asyncio.create_task(stream(i)) for i in range(STREAMS)]
        await all_started.wait()
        during = await metrics(client)
        assert during["ridgeline_num_requests_running"] + during["ridgeline_num_requests_waiting"] == STREAMS
        drop_now.set()

        # The aborts land within a step or two, while the kept streams are still generating.
        for _ in range(200):
            after_drop = await metrics(client)
            if after_drop.get("ridgeline_request_success_total:abort") == DROPPED:
                break
            await asyncio.sleep(0.01)
        assert after_drop["ridgeline_request_success_total:abort"] == DROPPED
        assert after_drop["ridgeline_num_requests_running"] + after_drop["ridgeline_num_requests_waiting"] == STREAMS - DROPPED
        assert after_drop["ridgeline_request_success_total:length"] == 0  # the others are not done yet

        results = await asyncio.gather(*tasks)
        for kept in results[DROPPED:]:
            assert kept["finish"] == "length"
            assert kept["usage"]["completion_tokens"] == KEPT_TOKENS
            assert kept["text"]

        final = await metrics(client)
        assert final["ridgeline_request_success_total:length"] == STREAMS - DROPPED
        assert final["ridgeline_request_success_total:abort"] == DROPPED
        assert final["ridgeline_num_requests_running"] == final["ridgeline_num_requests_waiting"] == 0
        assert final["ridgeline_kv_cache_free_pages"] == final["ridgeline_kv_cache_total_pages"]  # nothing leaked


def test_dropped_streams_are_aborted_and_free_their_blocks():
    with serve_tiny_model() as server:
        asyncio.run(scenario(server.url))


async def abandon_a_whole_response(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        body = {"prompt": "a long answer nobody waits for", "max_tokens": 480, "n": 8, "ignore_eos": True}
        try:
            await client.post("/v1/completions", json=body, timeout=0.3)
        except httpx.TimeoutException:
            pass  # the client gives up and closes the connection
        else:
            raise AssertionError("the request finished before the client gave up; make it longer")
        for _ in range(200):
            final = await metrics(client)
            if final.get("ridgeline_request_success_total:abort") == 8:
                break
            await asyncio.sleep(0.02)
        return final


def test_an_abandoned_non_streaming_request_is_aborted_too():
    with serve_tiny_model() as server:
        final = asyncio.run(abandon_a_whole_response(server.url))
    assert final["ridgeline_request_success_total:abort"] == 8
    assert final["ridgeline_request_success_total:length"] == 0
    assert final["ridgeline_kv_cache_free_pages"] == final["ridgeline_kv_cache_total_pages"]
