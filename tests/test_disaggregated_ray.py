"""Disaggregated workers as Ray actors on a local Ray cluster: the front finds them through the pool, answers equal
colocated ones, and a decode worker that dies is restarted by Ray and rejoins the pool. Nothing accepted is lost
(issue 41) here either: a prefill worker killed after its prefill and before the decode worker's pull makes the
front prefill again on the worker Ray restarted; the pool's hand-off settings reach the workers; a decode actor
stalled past the prefill worker's lease still gets its pages (the lease keeping the HTTP workers have)."""

import asyncio
import time

import httpx
import openai
import pytest

from ridgeline.cluster.handoff import HandoffConfig
from server_helpers import serve_tiny_model, tiny_model_path

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

PROMPT = "The quick brown fox jumps over the lazy dog " * 3
# Not the defaults, so that the workers are seen to have them: a decode worker's KV queue bound, a prefill lease.
SETTINGS = HandoffConfig(local_prefill_tokens=1, max_kv_waiting=5, kv_lease_seconds=20.0)


@pytest.fixture(scope="module")
def pool():
    from ridgeline.cluster.ray_pool import PoolConfig, RayWorkerPool
    from ridgeline.server.worker_server import start_worker_server

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = PoolConfig(model=str(tiny_model_path()), kv_cache_memory="10MiB", kv_cache_dtype="fp32",
                        cpus_per_worker=0.5, handoff=SETTINGS)
    workers = RayWorkerPool(config, start_worker_server, start_timeout=120)
    try:
        yield workers
    finally:
        workers.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def expected() -> str:
    with serve_tiny_model() as colocated:
        return answer(colocated.url)


def answer(url: str, reprefills: list[int] | None = None) -> str:
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    response = api.completions.with_raw_response.create(model=api.models.list().data[0].id, prompt=PROMPT,
                                                        max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    if reprefills is not None:
        reprefills.append(int(response.headers.get("x-ridgeline-reprefills", 0)))
    return response.parse().choices[0].text


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith((name + "{", name + " ")))


def test_ray_workers_serve_disaggregated_and_a_dead_worker_rejoins(pool, expected):
    from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
    from ridgeline.server.launcher import BackgroundServer

    with BackgroundServer(create_front_app(FrontConfig.of(SETTINGS), pool)) as front:
        assert answer(front.url) == expected
        (decode,) = pool.urls("decode")
        received = httpx.get(f"{decode}/metrics").text
        assert "ridgeline_kv_transfer_pages_received_total" in received

        ray.kill(pool.actors["decode"][0], no_restart=False)  # the worker process dies; Ray starts it again
        assert answer(front.url) == expected  # the front's next request finds the restarted worker
        assert pool.urls("decode") != [decode]


def eventually(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.05)


def kill(actor, url: str) -> None:
    """Kill a worker actor's process (Ray starts it again, at another address) and wait until it no longer answers."""
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=1)
        except httpx.HTTPError:
            return  # gone
        time.sleep(0.05)
    raise AssertionError(f"the killed worker {url} still answers")


def test_a_prefill_worker_killed_after_its_prefill_and_before_the_pull_is_prefilled_again(pool, expected):
    """The prefill worker actor has answered (its pages held for the decode worker) when it is killed, before the
    front hands the request to the decode worker; Ray restarts it elsewhere (another port). The decode worker's pull
    finds nothing there (503 kv_pages_gone, at once: the connection is refused), the front looks for the pool's
    prefill workers again and prefills on the restarted one: the answer is the colocated one, one re-prefill counted
    (header and /metrics), no refusal, and no KV page left taken on either side. The kill is placed in the front's
    own hand-off, after the prefill answered and before the decode request goes out: no timing decides the order."""
    from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
    from ridgeline.server.launcher import BackgroundServer

    (decode,) = pool.urls("decode")
    assert httpx.post(f"{decode}/v1/kv/lookup", json={"prompt": PROMPT}).json()["max_kv_waiting"] == 5  # SETTINGS
    failed_before = metric(decode, "ridgeline_kv_transfers_failed_total")
    seen = {}

    with BackgroundServer(create_front_app(FrontConfig.of(SETTINGS), pool)) as proxy:
        front = proxy.server.config.app.state.front
        hand_over = front._decode

        async def hand_over_after_a_kill(decode_url, path, body, prefill_url, kv, raw):
            if not seen:
                seen["lease"], seen["prefill"] = kv.lease_seconds, prefill_url
                await asyncio.to_thread(kill, pool.actors["prefill"][0], prefill_url)
            return await hand_over(decode_url, path, body, prefill_url, kv, raw)

        front._decode = hand_over_after_a_kill
        reprefills: list[int] = []
        assert answer(proxy.url, reprefills) == expected
        assert reprefills == [1] and metric(proxy.url, "ridgeline_front_reprefills_total") == 1
        assert metric(proxy.url, "ridgeline_front_refusals_total") == 0
        assert seen["lease"] == SETTINGS.kv_lease_seconds  # the prefill worker's lease came from the pool's settings
    (restarted,) = pool.urls("prefill")
    assert metric(decode, "ridgeline_kv_transfers_failed_total") == failed_before + 1
    assert metric(decode, "ridgeline_kv_cache_free_pages") == metric(decode, "ridgeline_kv_cache_total_pages")
    eventually(lambda: metric(restarted, "ridgeline_kv_held_requests") == 0)  # freed as its Done arrives


def test_a_decode_worker_killed_between_prefill_and_hand_off_gets_the_same_pages_sent_to_its_restart(pool, expected):
    """The prefill worker has answered when the decode worker actor the front picked is killed (Ray restarts it at
    another address). The front finds it gone, asks the pool again, and hands the same pages, their lease kept
    alive meanwhile, to the restarted decode worker: the colocated answer, one prefill in all, no re-prefill."""
    from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
    from ridgeline.server.launcher import BackgroundServer

    (prefill,) = pool.urls("prefill")
    killed = []
    with BackgroundServer(create_front_app(FrontConfig.of(SETTINGS), pool)) as proxy:
        front = proxy.server.config.app.state.front
        hand_over = front._decode

        async def hand_over_after_a_kill(decode_url, path, body, prefill_url, kv, raw):
            if not killed:
                killed.append(decode_url)
                await asyncio.to_thread(kill, pool.actors["decode"][0], decode_url)
            return await hand_over(decode_url, path, body, prefill_url, kv, raw)

        front._decode = hand_over_after_a_kill
        reprefills: list[int] = []
        assert answer(proxy.url, reprefills) == expected
        assert killed and reprefills == [0] and metric(proxy.url, "ridgeline_front_reprefills_total") == 0
        assert metric(proxy.url, 'ridgeline_front_prefills_total{placement="remote"}') == 1
    (restarted,) = pool.urls("decode")
    assert metric(restarted, "ridgeline_kv_transfer_pages_received_total") > 0
    assert metric(restarted, "ridgeline_kv_cache_free_pages") == metric(restarted, "ridgeline_kv_cache_total_pages")
    eventually(lambda: metric(prefill, "ridgeline_kv_held_requests") == 0)


def stalled_decode_start(release_file: str):
    """A worker start (as server/worker_server.py's) with a fault hook in a decode worker's actor process: the moment
    that worker takes its first prefilled request, its engine lock is held -- a decode step that does not end --
    until `release_file` exists. The hook, not a timing, puts the stall between the take and the pull. (A closure,
    so Ray ships it by value; it imports what it needs inside the actor.)"""

    def start(role, config, host):
        import os
        import threading
        import time

        from ridgeline.engine.messages import ReceiveKV
        from ridgeline.server.kv_intake import KVIntake
        from ridgeline.server.worker_server import start_worker_server

        if role == "decode":
            accept = KVIntake.accept

            def accept_then_stall(self, messages):
                accept(self, messages)
                if any(isinstance(m, ReceiveKV) for m in messages) and not getattr(self, "stalled", False):
                    self.stalled = True
                    self.driver.engine_lock.acquire()  # (a plain Lock: the thread below may let it go)

                    def release() -> None:
                        deadline = time.monotonic() + 120  # never past the test, whatever happens to it
                        while not os.path.exists(release_file) and time.monotonic() < deadline:
                            time.sleep(0.05)
                        self.driver.engine_lock.release()

                    threading.Thread(target=release, daemon=True).start()

            KVIntake.accept = accept_then_stall
        return start_worker_server(role, config, host)

    return start


def test_on_ray_a_decode_step_three_leases_long_does_not_cost_the_request_its_pages(pool, expected, tmp_path):
    """Issue 41's lease race on the Ray path. A Ray worker runs the very server `serve --role` runs (create_app,
    with the same KV source, intake and LeaseKeeper: server/worker_server.py), so the races are tested in-process
    with a fake clock (tests/test_disaggregated_leases.py: lease expiry during a slow step, release racing a pull);
    this one test shows that path is the one the actors run. The decode actor stalls (engine lock held) from taking
    the request until three of the prefill actor's 1 s leases have passed: the decode worker's keeper keeps the
    lease alive off the engine, so the answer is the colocated one, with no re-prefill and no failed transfer. The
    pool also gives the decode role its own, smaller KV budget (--decode-kv-cache-memory), seen in its page count."""
    import threading

    from ridgeline.cluster.ray_pool import PoolConfig, RayWorkerPool
    from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
    from ridgeline.server.launcher import BackgroundServer

    settings = HandoffConfig(local_prefill_tokens=1, kv_lease_seconds=1.0)
    release = tmp_path / "release"
    config = PoolConfig(model=str(tiny_model_path()), kv_cache_memory="10MiB", decode_kv_cache_memory="6MiB",
                        kv_cache_dtype="fp32", cpus_per_worker=0.5, handoff=settings)
    stalled = RayWorkerPool(config, stalled_decode_start(str(release)), start_timeout=120)
    try:
        (prefill,), (decode,) = stalled.urls("prefill"), stalled.urls("decode")
        with BackgroundServer(create_front_app(FrontConfig.of(settings), stalled)) as front:
            reprefills: list[int] = []
            outcome: dict = {}
            asking = threading.Thread(target=lambda: outcome.update(text=answer(front.url, reprefills)))
            asking.start()

            def kv_waiting() -> int:
                return httpx.post(f"{decode}/v1/kv/lookup", json={"prompt": PROMPT}).json()["kv_waiting"]

            eventually(lambda: kv_waiting() == 1, 60)  # taken, and stuck behind the stalled step
            time.sleep(3.0)  # three leases
            assert metric(prefill, "ridgeline_kv_held_requests") == 1, "the lease lapsed"
            release.touch()
            asking.join(60)
            assert outcome.get("text") == expected
            assert reprefills == [0] and metric(front.url, "ridgeline_front_reprefills_total") == 0
        assert metric(decode, "ridgeline_kv_transfers_failed_total") == 0
        eventually(lambda: metric(prefill, "ridgeline_kv_held_requests") == 0)
        # (the page gauges are published once a worker has stepped)
        assert 0 < metric(decode, "ridgeline_kv_cache_total_pages") < metric(prefill, "ridgeline_kv_cache_total_pages")
    finally:
        release.touch()
        stalled.shutdown()
