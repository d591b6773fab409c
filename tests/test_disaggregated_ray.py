"""Disaggregated workers as Ray actors on a local Ray cluster: the front finds them through the pool, answers equal
colocated ones, and a decode worker that dies is restarted by Ray and rejoins the pool."""

import httpx
import openai
import pytest

from server_helpers import serve_tiny_model, tiny_model_path

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

PROMPT = "The quick brown fox jumps over the lazy dog " * 3


@pytest.fixture(scope="module")
def pool():
    from ridgeline.cluster.ray_pool import PoolConfig, RayWorkerPool
    from ridgeline.server.worker_server import start_worker_server

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = PoolConfig(model=str(tiny_model_path()), kv_cache_memory="10MiB", kv_cache_dtype="fp32",
                        cpus_per_worker=0.5)
    workers = RayWorkerPool(config, start_worker_server, start_timeout=120)
    try:
        yield workers
    finally:
        workers.shutdown()
        ray.shutdown()


def answer(url: str) -> str:
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    return api.completions.create(model=api.models.list().data[0].id, prompt=PROMPT, max_tokens=10, temperature=0,
                                  extra_body={"ignore_eos": True}).choices[0].text


def test_ray_workers_serve_disaggregated_and_a_dead_worker_rejoins(pool):
    from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
    from ridgeline.server.launcher import BackgroundServer

    with serve_tiny_model() as colocated, BackgroundServer(create_front_app(FrontConfig(local_prefill_tokens=1),
                                                                            pool)) as front:
        expected = answer(colocated.url)
        assert answer(front.url) == expected
        (decode,) = pool.urls("decode")
        received = httpx.get(f"{decode}/metrics").text
        assert "ridgeline_kv_transfer_pages_received_total" in received

        ray.kill(pool.actors["decode"][0], no_restart=False)  # the worker process dies; Ray starts it again
        assert answer(front.url) == expected  # the front's next request finds the restarted worker
        assert pool.urls("decode") != [decode]
