"""Workers as Ray actors on a small local Ray cluster: the router streams from them, reads their reports, and a
killed actor fails its request in flight with a clean error while the next request goes to the other actor."""

import asyncio

import pytest

ray = pytest.importorskip("ray")

from cluster_helpers import TEST_RATES, request  # noqa: E402
from ridgeline.cluster.errors import ReplicaFailed  # noqa: E402
from ridgeline.cluster.rates import Rates  # noqa: E402
from ridgeline.cluster.ray_replica import RayReplica  # noqa: E402
from ridgeline.cluster.ray_worker import ensure_ray  # noqa: E402
from ridgeline.cluster.router import ModelGroup, Router  # noqa: E402
from ridgeline.engine.kv_cache import KVCacheConfig  # noqa: E402
from ridgeline.engine.llm_engine import EngineConfig  # noqa: E402
from ridgeline.engine.scheduler import SchedulerConfig  # noqa: E402
from server_helpers import KV_BYTES_PER_TOKEN, tiny_model_path  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    ensure_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.mark.slow  # a local Ray cluster and two actor processes: ~25 s on two shared cores
def test_router_over_ray_actors_streams_reports_and_survives_a_killed_actor(ray_cluster):
    config = EngineConfig(model=str(tiny_model_path()), threads=1,
                          kv_cache=KVCacheConfig(16, "fp32", 256 * 16 * KV_BYTES_PER_TOKEN),
                          scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256))

    async def main():
        replicas = [RayReplica(f"m/{i}", "m", config, num_cpus=1) for i in range(2)]
        await asyncio.gather(*(r.ready() for r in replicas))
        router = Router([ModelGroup("m", 0.5, replicas)], {r.name: Rates(*TEST_RATES, "configured") for r in replicas},
                        health_interval_s=3600)
        await router.start()
        try:
            prompt = list(range(3, 3 + 40))
            outputs = [o async for o in router.generate("m", request(prompt, max_tokens=5))]
            assert outputs[-1].finished and len(outputs[-1].output_token_ids) == 5
            await router.probe_all()
            holder = "m/0" if router.index.num_blocks("m/0") else "m/1"
            assert router.index.num_blocks(holder) == 2  # the prompt's two full blocks, reported by the actor
            # The same prompt goes back to the actor holding its blocks, and hits its cache there.
            again = [o async for o in router.generate("m", request(prompt, max_tokens=2))][-1]
            assert again.num_cached_tokens == 32 and router.loads.of(holder).sent == 2

            stream = router.generate("m", request(list(range(5, 25)), max_tokens=400))
            await stream.__anext__()
            victim = next(name for name in ("m/0", "m/1") if router.loads.of(name).num_in_flight)
            router.replicas[victim].kill()
            with pytest.raises(ReplicaFailed):
                await asyncio.wait_for(_drain(stream), 30)
            assert not router.health[victim].up
            survivor = [o async for o in router.generate("m", request([7, 8, 9], max_tokens=3))][-1]
            assert survivor.finished
        finally:
            await router.close()

    asyncio.run(main())


async def _drain(stream):
    async for _ in stream:
        pass
