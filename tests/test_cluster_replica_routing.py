"""Replica routing over real tiny engines: load counted at dispatch spreads a burst, uniform traffic stays even,
shared prefixes stick to the replica holding them (fewer prefilled tokens than round-robin), and a dead replica
fails its requests in flight cleanly while new ones go elsewhere until it rejoins."""

import asyncio

import numpy as np
import pytest

from cluster_helpers import local_group, make_router, request, run_one
from ridgeline.cluster.errors import ReplicaFailed


def sent(router, model: str) -> list[int]:
    return [router.loads.of(r.name).sent for r in router.groups[model].replicas]


def random_prompt(rng, length: int) -> list[int]:
    return rng.integers(3, 320, length).tolist()


async def closed(router):
    await router.close()


def test_burst_of_64_is_spread_by_load_counted_at_dispatch():
    async def main():
        router = make_router([local_group("m", replicas=2)])
        rng = np.random.default_rng(0)
        try:
            # All 64 are dispatched before any replica reports or finishes anything: only counted load can spread them.
            outputs = await asyncio.gather(*(run_one(router, "m", random_prompt(rng, 24)) for _ in range(64)))
            assert all(o.finished and o.finish_reason == "length" for o in outputs)
            counts = sent(router, "m")
            assert sum(counts) == 64 and max(counts) <= 1.3 * min(counts), counts
            assert all(router.loads.of(r).reports == 0 for r in ("m/0", "m/1"))
            assert all(router.loads.of(r).num_in_flight == 0 for r in ("m/0", "m/1"))  # decremented on finish
        finally:
            await closed(router)

    asyncio.run(main())


def test_uniform_traffic_keeps_replicas_within_1_3x():
    async def main():
        router = make_router([local_group("m", replicas=3)])
        rng = np.random.default_rng(1)
        try:
            for _ in range(12):  # waves of 8 concurrent requests with reports in between
                await asyncio.gather(*(run_one(router, "m", random_prompt(rng, int(rng.integers(8, 60))), 3)
                                       for _ in range(8)))
                await router.probe_all()
            counts = sent(router, "m")
            assert sum(counts) == 96 and max(counts) <= 1.3 * min(counts), counts
        finally:
            await closed(router)

    asyncio.run(main())


async def _shared_prefix_prefilled_tokens(policy: str) -> tuple[int, list[int]]:
    # 8 system prompts of 10 blocks; each replica's KV pool holds about 4.8 of them, so a replica that sees all 8
    # keeps evicting what it will need next, and one that sees only its own 4 keeps them all.
    router = make_router([local_group("m", replicas=2, num_blocks=48)], policy=policy)
    rng = np.random.default_rng(2)
    systems = [random_prompt(rng, 160) for _ in range(8)]
    prefilled = 0
    try:
        for _ in range(64):
            prompt = systems[int(rng.integers(8))] + random_prompt(rng, int(rng.integers(4, 12)))
            output = await run_one(router, "m", prompt, 2)
            prefilled += len(prompt) - output.num_cached_tokens
            await router.probe_all()  # the workers' reports: cache events and backlog
        return prefilled, sent(router, "m")
    finally:
        await closed(router)


def test_prefix_affinity_prefills_at_least_2x_fewer_tokens_than_round_robin():
    affinity, affinity_counts = asyncio.run(_shared_prefix_prefilled_tokens("cost"))
    round_robin, _ = asyncio.run(_shared_prefix_prefilled_tokens("round_robin"))
    assert round_robin >= 2 * affinity, (affinity, round_robin)
    assert min(affinity_counts) > 0  # the prefixes were shared out, not all sent to one replica


def test_a_prefix_still_prefilling_draws_the_next_turn_before_any_report():
    async def main():
        router = make_router([local_group("m", replicas=2)])
        rng = np.random.default_rng(3)
        system = random_prompt(rng, 160)
        try:
            first = asyncio.create_task(run_one(router, "m", system + random_prompt(rng, 5), 200))
            await asyncio.sleep(0)  # dispatched; no report has been taken
            holder = next(r for r in ("m/0", "m/1") if router.loads.of(r).num_in_flight)
            ranked = router.rank("m", 170, 4, system + random_prompt(rng, 5))
            assert {c.replica: c.cached_tokens for c in ranked} == {holder: 160, ({"m/0", "m/1"} - {holder}).pop(): 0}
            await first
        finally:
            await closed(router)

    asyncio.run(main())


def test_dead_replica_fails_in_flight_requests_cleanly_new_ones_fail_over_and_it_rejoins():
    async def main():
        group = local_group("m", replicas=2)
        router = make_router([group])
        rng = np.random.default_rng(3)
        started = asyncio.Event()
        seen: dict[str, int] = {}

        async def long_request(req):
            async for output in router.generate("m", req):
                seen[req.request_id] = seen.get(req.request_id, 0) + 1
                if len(seen) == 8:
                    started.set()
            return output

        try:
            requests = [request(random_prompt(rng, 16), max_tokens=480) for _ in range(8)]
            tasks = [asyncio.create_task(long_request(r)) for r in requests]
            await asyncio.wait_for(started.wait(), 30)
            on_dead = {rid for rid in router.loads.of("m/0").in_flight}
            assert len(on_dead) == 4
            group.replicas[0].kill("test killed the worker")
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)  # nothing hangs
            for req, result in zip(requests, results):
                if req.request_id in on_dead:
                    assert isinstance(result, ReplicaFailed) and "test killed the worker" in str(result)
                else:
                    assert result.finished and len(result.output_token_ids) == 480
            assert not router.health["m/0"].up
            assert router.loads.of("m/0").num_in_flight == 0  # errors decrement the counted load too

            before = sent(router, "m")
            for _ in range(4):
                assert (await run_one(router, "m", random_prompt(rng, 16))).finished
            after = sent(router, "m")
            assert after[0] == before[0] and after[1] == before[1] + 4

            group.replicas[0].restart()
            await router.probe_all()
            assert router.health["m/0"].up
            await asyncio.gather(*(run_one(router, "m", random_prompt(rng, 16)) for _ in range(4)))
            assert sent(router, "m")[0] > after[0]  # back in rotation
        finally:
            await closed(router)

    asyncio.run(main())


def test_a_replica_that_died_unnoticed_is_failed_over_before_any_output():
    async def main():
        group = local_group("m", replicas=2)
        router = make_router([group])
        try:
            group.replicas[0].kill("gone")  # the router has not probed since
            outputs = [await run_one(router, "m", [5, 6, 7, 8]) for _ in range(3)]
            assert all(o.finished for o in outputs)
            assert not router.health["m/0"].up
            text = router.metrics.render().decode()
            assert 'ridgeline_router_failovers_total{from_replica="m/0",model="m"} 1.0' in text
        finally:
            await closed(router)

    asyncio.run(main())


@pytest.mark.parametrize("cancel_after", [1])
def test_cancelled_request_is_aborted_on_the_worker_and_uncounted(cancel_after):
    async def main():
        group = local_group("m", replicas=1)
        router = make_router([group])
        try:
            stream = router.generate("m", request([5] * 20, max_tokens=400))
            await stream.__anext__()
            await stream.aclose()  # the client went away
            assert router.loads.of("m/0").num_in_flight == 0
            for _ in range(200):
                status = group.replicas[0].worker.status()
                if status.num_running == 0 and status.num_waiting == 0 and status.num_free_pages == status.num_total_pages:
                    break
                await asyncio.sleep(0.01)
            assert status.num_running == 0 and status.num_free_pages == status.num_total_pages > 0
        finally:
            await closed(router)

    asyncio.run(main())
