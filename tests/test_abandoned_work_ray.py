"""Work nobody waits for (issue 38), on the router's Ray backend: a client that leaves the router's endpoint gets
its request aborted inside the worker's actor, whether it was still queued there or decoding, and the next
request's greedy answer is unchanged. (The HTTP backends and the disaggregated front: test_abandoned_work.py.)"""

import asyncio

import httpx
import pytest

ray = pytest.importorskip("ray")

from server_helpers import KV_BYTES_PER_TOKEN, tiny_engine, tiny_model_path  # noqa: E402
from ridgeline.cluster.rates import Rates  # noqa: E402
from ridgeline.cluster.ray_replica import RayReplica  # noqa: E402
from ridgeline.cluster.ray_worker import ensure_ray  # noqa: E402
from ridgeline.cluster.router import ModelGroup, Router  # noqa: E402
from ridgeline.engine.kv_cache import KVCacheConfig  # noqa: E402
from ridgeline.engine.llm_engine import EngineConfig  # noqa: E402
from ridgeline.engine.scheduler import SchedulerConfig  # noqa: E402
from ridgeline.server.launcher import BackgroundServer  # noqa: E402
from ridgeline.server.router_app import create_router_app  # noqa: E402

pytestmark = pytest.mark.slow  # a local Ray cluster and an actor process: ~20 s on two shared cores

BODY = {"model": "m", "prompt": "The quick brown fox jumps over the lazy dog", "temperature": 0, "ignore_eos": True}


async def poll(condition, seconds: float = 5.0) -> None:
    """`condition` (a coroutine function) comes true within `seconds` (the issue's bound)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never came true"
        await asyncio.sleep(0.05)


def test_router_over_ray_aborts_a_queued_and_a_decoding_request_whose_clients_left():
    ensure_ray(num_cpus=2)
    config = EngineConfig(model=str(tiny_model_path()), threads=1,
                          kv_cache=KVCacheConfig(16, "fp32", 256 * 16 * KV_BYTES_PER_TOKEN),
                          scheduler=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=256))  # one runs, one waits
    local = tiny_engine()
    holder = {}

    async def build() -> Router:
        replica = RayReplica("m/0", "m", config, num_cpus=1)
        await replica.ready()
        router = Router([ModelGroup("m", 0.5, [replica], tokenizer=local.tokenizer, admission=local.admission)],
                        {"m/0": Rates(2000.0, 100.0, "configured")}, health_interval_s=3600, learn_rates=False)
        await router.start()
        holder["router"] = router
        return router

    try:
        with BackgroundServer(create_router_app(build)) as server:
            replica = holder["router"].replicas["m/0"]

            async def scenario() -> None:
                async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                    before = (await client.post("/v1/completions", json={**BODY, "max_tokens": 8})).json()

                    async def backlog() -> tuple[int, int]:
                        report = await replica.actor.status.remote()
                        return report.num_running, report.num_waiting

                    # A stream that decodes (the batch's one slot), and behind it a request that waits.
                    async with client.stream("POST", "/v1/completions",
                                             json={**BODY, "max_tokens": 480, "stream": True}) as decoding:
                        lines = decoding.aiter_lines()
                        while not (await anext(lines)).startswith("data: {"):
                            pass
                        queued = asyncio.create_task(client.post("/v1/completions", json={**BODY, "max_tokens": 8}))

                        async def one_waits() -> bool:
                            return await backlog() == (1, 1)

                        await poll(one_waits, 30)
                        queued.cancel()  # the queued request's client leaves: it never runs

                        async def none_waits() -> bool:
                            return await backlog() == (1, 0)

                        await poll(none_waits)
                    # ... and the decoding stream's client leaves too

                    async def idle() -> bool:
                        return await backlog() == (0, 0)

                    await poll(idle)
                    # Both were stopped part-way (a stream that had run to its end would count "ok")
                    cancelled = holder["router"].metrics.requests.labels("m", "m/0", "cancelled")._value.get()
                    assert cancelled == 2
                    after = (await client.post("/v1/completions", json={**BODY, "max_tokens": 8})).json()
                    assert after["choices"][0]["text"] == before["choices"][0]["text"]

            asyncio.run(scenario())
    finally:
        ray.shutdown()


def test_router_over_ray_aborts_a_request_mid_prefill_and_the_actor_frees_every_page():
    """A long prompt prefilled in 16-token chunks (many steps): the client leaves while the actor is part-way
    through it, and the actor's status shows nothing running or waiting and every KV page free within 5 s."""
    ensure_ray(num_cpus=2)
    config = EngineConfig(model=str(tiny_model_path(4096)), threads=1,
                          kv_cache=KVCacheConfig(16, "fp32", 512 * 16 * KV_BYTES_PER_TOKEN),
                          scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16))
    local = tiny_engine(context=4096)
    holder = {}

    async def build() -> Router:
        replica = RayReplica("m/0", "m", config, num_cpus=1)
        await replica.ready()
        router = Router([ModelGroup("m", 0.5, [replica], tokenizer=local.tokenizer, admission=local.admission)],
                        {"m/0": Rates(2000.0, 100.0, "configured")}, health_interval_s=3600, learn_rates=False)
        await router.start()
        holder["router"] = router
        return router

    prompt = " ".join(f"w{i % 97}" for i in range(1000))  # thousands of tokens: a couple of hundred chunks
    try:
        with BackgroundServer(create_router_app(build)) as server:
            replica = holder["router"].replicas["m/0"]

            async def scenario() -> None:
                async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                    sending = asyncio.create_task(client.post("/v1/completions", json={**BODY, "prompt": prompt,
                                                                                        "max_tokens": 8}))

                    async def mid_prefill() -> bool:
                        report = await replica.actor.status.remote()
                        return report.num_running == 1 and report.queued_prefill_tokens > 0

                    await poll(mid_prefill, 30)
                    sending.cancel()  # the client leaves part-way through its prefill

                    async def freed() -> bool:
                        report = await replica.actor.status.remote()
                        return (report.num_running, report.num_waiting) == (0, 0) and \
                            report.num_free_pages == report.num_total_pages

                    await poll(freed)
                    cancelled = holder["router"].metrics.requests.labels("m", "m/0", "cancelled")._value.get()
                    assert cancelled == 1

            asyncio.run(scenario())
    finally:
        ray.shutdown()
