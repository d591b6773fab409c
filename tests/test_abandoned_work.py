"""Work nobody waits for (issue 38): a client that leaves stops costing compute on every worker behind the front
and the router, wherever its request is when it leaves.

Each cancellation point is made to happen on purpose, not by timing luck: "before schedule" holds the worker's
engine lock (the engine cannot look at the request), "mid-prefill" stops the worker's forward pass inside the
step that prefills it, "mid-transfer" paces the prefill worker's KV link so the pull takes seconds, "mid-decode"
cuts a stream after a few events. After each, every worker reports within a short bound 0 running, 0 waiting,
every page free and no KV held or waiting for a transfer; a prefill worker's count of prefills done for a client
already gone is at most the requests in flight when it left; and the next request's greedy answer is unchanged.
"""

import asyncio
import contextlib
import json
import threading
import time

import httpx
import pytest

from server_helpers import tiny_engine

from ridgeline.cluster.http_replica import HttpReplica
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
from ridgeline.server.launcher import BackgroundServer
from ridgeline.server.router_app import create_router_app

PROMPT = "The quick brown fox jumps over the lazy dog " * 3
LONG_PROMPT = "Once upon a time there was a prompt, a cache and a server. " * 8  # ~8 KV pages to move
SETTLE_SECONDS = 5.0  # "within a short bound": the 5 s


def serve(role: str = "both", engine=None, **options) -> BackgroundServer:
    return BackgroundServer(create_app(engine or tiny_engine(), ServerConfig(role=role, **options)), drain_timeout=1.0)


def front(prefill: str, decode: str) -> BackgroundServer:
    return BackgroundServer(create_front_app(FrontConfig((prefill,), (decode,), local_prefill_tokens=1)))


def router_over(*urls: str) -> BackgroundServer:
    async def build() -> Router:
        replicas = [HttpReplica(f"m/{i}", "m", url, served_name="tiny-llama") for i, url in enumerate(urls)]
        router = Router([ModelGroup("m", 0.5, replicas)], {r.name: Rates(2000.0, 100.0, "configured") for r in replicas},
                        health_interval_s=3600, learn_rates=False)
        await router.start()
        return router

    return BackgroundServer(create_router_app(build))


def metrics(url: str) -> dict[str, float]:
    """Every sample of a server's /metrics, by name (labels dropped, values of one name summed)."""
    values: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = name.split("{")[0]
            values[name] = values.get(name, 0.0) + float(value)
    return values


def idle(url: str) -> bool:
    """0 running, 0 waiting, every page free, no KV held for a decode worker nor waiting for a transfer."""
    m = metrics(url)
    kv_waiting = httpx.post(f"{url}/v1/kv/lookup", json={"prompt": "x"}, timeout=5).json()["kv_waiting"]
    return (m["ridgeline_num_requests_running"] == m["ridgeline_num_requests_waiting"] == 0
            and m["ridgeline_kv_cache_free_pages"] == m["ridgeline_kv_cache_total_pages"]
            and m["ridgeline_kv_held_requests"] == 0 and kv_waiting == 0)


def wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.02)


def body(prompt: str = PROMPT, max_tokens: int = 8, **more) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **more}


def complete(url: str, prompt: str = PROMPT) -> str:
    answer = httpx.post(f"{url}/v1/completions", json=body(prompt), timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["text"]


def leave_when(url: str, request: dict, condition, stream_events: int | None = None) -> None:
    """Send `request` and close the connection once `condition()` holds (checked off the event loop), or, for a
    stream, after `stream_events` events."""

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            if stream_events is not None:
                async with client.stream("POST", f"{url}/v1/completions", json={**request, "stream": True}) as response:
                    assert response.status_code == 200
                    seen = 0
                    async for line in response.aiter_lines():
                        seen += line.startswith("data: {")
                        if seen == stream_events:
                            return  # leaving the block closes the connection mid-stream
                raise AssertionError("the stream ended before the client left")
            sending = asyncio.create_task(client.post(f"{url}/v1/completions", json=request))
            while not await asyncio.to_thread(condition):
                assert not sending.done(), f"answered before the client left: {sending.result().text[:200]}"
                await asyncio.sleep(0.02)
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending

    asyncio.run(scenario())


def paused_forward(engine) -> tuple[threading.Event, threading.Event]:
    """The engine's next forward pass stops inside its step (engine lock held, as a long prefill holds it) until
    `go` is set; `entered` says it got there."""
    entered, go = threading.Event(), threading.Event()
    forward = engine.runner.forward

    def held(*args, **kwargs):
        entered.set()
        assert go.wait(60)
        return forward(*args, **kwargs)

    engine.runner.forward = held
    return entered, go


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    with serve() as colocated:
        return {prompt: complete(colocated.url, prompt) for prompt in (PROMPT, LONG_PROMPT)}


@pytest.fixture
def disaggregated():
    """A prefill worker (its KV link paced so that moving a long prompt takes seconds), a decode worker and a
    front; yields (front, prefill, decode, prefill engine)."""
    prefill_engine = tiny_engine()
    with serve("prefill", engine=prefill_engine, kv_link_bytes_per_second=16_000) as prefill, \
            serve("decode") as decode, front(prefill.url, decode.url) as proxy:
        yield proxy, prefill, decode, prefill_engine


def driver(server: BackgroundServer):
    return server.server.config.app.state.serving.engine


def settled(*workers: BackgroundServer) -> None:
    wait_for(lambda: all(idle(w.url) for w in workers), SETTLE_SECONDS)


# ---------------------------------------------------------------------------------------------- the front


def test_front_a_client_gone_before_its_prefill_is_scheduled_costs_no_prefill(disaggregated, expected):
    proxy, prefill, decode, _ = disaggregated
    with driver(prefill).engine_lock:  # the prefill engine cannot look at the request
        leave_when(proxy.url, body(), lambda: _submitted(prefill))
        wait_for(lambda: metrics(prefill.url)["ridgeline_requests_client_left_total"] == 1)  # the abort is queued
    settled(prefill, decode)
    assert metrics(prefill.url)["ridgeline_prefills_for_gone_clients_total"] == 0
    assert metrics(prefill.url)["ridgeline_prefilled_tokens"] == 0
    assert metrics(proxy.url)["ridgeline_front_client_left_total"] == 1
    assert complete(proxy.url) == expected[PROMPT]
    settled(prefill, decode)


def _submitted(server: BackgroundServer) -> bool:
    """The request reached the worker's engine thread (queued: in flight, not yet looked at)."""
    return driver(server).thread.in_flight == 1


def test_front_a_client_gone_mid_prefill_costs_that_one_prefill_and_no_held_pages(disaggregated, expected):
    proxy, prefill, decode, prefill_engine = disaggregated
    entered, go = paused_forward(prefill_engine)
    leave_when(proxy.url, body(), entered.is_set)
    wait_for(lambda: metrics(prefill.url)["ridgeline_requests_client_left_total"] == 1)
    go.set()  # the step under way when the client left completes: its pages are freed, not held a lease
    settled(prefill, decode)
    assert metrics(prefill.url)["ridgeline_prefills_for_gone_clients_total"] == 1  # the one in flight, no more
    assert complete(proxy.url) == expected[PROMPT]
    settled(prefill, decode)


def test_front_a_client_gone_mid_transfer_frees_both_sides(disaggregated, expected):
    proxy, prefill, decode, _ = disaggregated

    def pulling() -> bool:
        sent = metrics(prefill.url)["ridgeline_kv_transfer_pages_sent"]
        return sent >= 1

    leave_when(proxy.url, body(LONG_PROMPT), pulling)
    assert metrics(prefill.url)["ridgeline_kv_transfer_pages_sent"] < 8, "the transfer was over before the client left"
    settled(prefill, decode)
    assert metrics(prefill.url)["ridgeline_prefills_for_gone_clients_total"] == 0  # prefilled while it waited
    assert metrics(decode.url)["ridgeline_requests_client_left_total"] == 1
    assert complete(proxy.url, LONG_PROMPT) == expected[LONG_PROMPT]
    settled(prefill, decode)


def test_front_a_client_gone_mid_decode_frees_the_decode_worker(disaggregated, expected):
    proxy, prefill, decode, _ = disaggregated
    leave_when(proxy.url, body(max_tokens=400), None, stream_events=3)
    settled(prefill, decode)
    m = metrics(decode.url)
    assert m["ridgeline_requests_client_left_total"] == 1 and m["ridgeline_generation_tokens_total"] < 400
    assert complete(proxy.url) == expected[PROMPT]
    settled(prefill, decode)


class AnswersHeldOnTheWire:
    """A prefill worker's app whose completions answers, ready and their pages offered (the lease running), are
    held before their first byte goes out until `go` is set: a front cancelled now never reads the answer, so
    never learns whose pages those are -- what a client leaving at exactly that moment does."""

    def __init__(self, app):
        self.app = app
        self.state = app.state
        self.holding, self.go = threading.Event(), threading.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            await self.app(scope, receive, send)
            return

        async def held(message):
            if message["type"] == "http.response.start":
                self.holding.set()
                await asyncio.to_thread(self.go.wait, 60)
            await send(message)

        await self.app(scope, receive, held)


def test_front_a_client_gone_while_the_prefill_answer_is_on_the_wire_leaves_no_page_held(expected):
    """The front names the request and releases it by that name when cancelled, answer read or not: the prefill
    worker's pages are freed within a second, not a 30 s lease later."""
    wire = AnswersHeldOnTheWire(create_app(tiny_engine(), ServerConfig(role="prefill")))
    with BackgroundServer(wire, drain_timeout=1.0) as prefill, serve("decode") as decode, \
            front(prefill.url, decode.url) as proxy:
        try:
            leave_when(proxy.url, body(), wire.holding.is_set)
            left = time.monotonic()
            wait_for(lambda: idle(prefill.url), 1.0)
            assert time.monotonic() - left < 1.0
            assert metrics(prefill.url)["ridgeline_kv_transfer_pages_sent"] == 0  # no decode worker pulled them
            assert metrics(proxy.url)["ridgeline_front_cancelled_prefill_releases_total"] == 1
        finally:
            wire.go.set()
        assert complete(proxy.url) == expected[PROMPT]
        settled(prefill, decode)


# ---------------------------------------------------------------------------------------------- the router


@pytest.fixture
def routed():
    """A router over one colocated worker (an OpenAI-server replica over HTTP); yields (router, worker, engine)."""
    engine = tiny_engine()
    with serve(engine=engine) as worker, router_over(worker.url) as router:
        yield router, worker, engine


def test_router_a_client_gone_before_schedule_is_never_computed(routed, expected):
    router, worker, _ = routed
    with driver(worker).engine_lock:
        leave_when(router.url, body(model="m"), lambda: _submitted(worker))
        wait_for(lambda: metrics(worker.url)["ridgeline_requests_client_left_total"] == 1)
    settled(worker)
    assert metrics(worker.url)["ridgeline_prefilled_tokens"] == 0
    assert complete(router.url) == expected[PROMPT]


def test_router_a_client_gone_mid_prefill_is_aborted_after_that_step(routed, expected):
    router, worker, engine = routed
    entered, go = paused_forward(engine)
    leave_when(router.url, body(model="m", max_tokens=400), entered.is_set)
    wait_for(lambda: metrics(worker.url)["ridgeline_requests_client_left_total"] == 1)
    go.set()
    settled(worker)
    assert metrics(worker.url)["ridgeline_generation_tokens_total"] <= 1  # the step under way, no more
    assert complete(router.url) == expected[PROMPT]


def test_router_a_client_gone_mid_decode_frees_the_worker(routed, expected):
    router, worker, _ = routed
    leave_when(router.url, body(model="m", max_tokens=400), None, stream_events=3)
    settled(worker)
    assert metrics(worker.url)["ridgeline_generation_tokens_total"] < 400
    assert complete(router.url) == expected[PROMPT]


def test_router_over_a_front_a_client_gone_mid_transfer_frees_every_worker(disaggregated, expected):
    """Two hops: router -> front -> workers. The abort travels both."""
    proxy, prefill, decode, _ = disaggregated
    with router_over(proxy.url) as router:
        leave_when(router.url, body(LONG_PROMPT, model="m"),
                   lambda: metrics(prefill.url)["ridgeline_kv_transfer_pages_sent"] >= 1)
        settled(prefill, decode)
        assert metrics(proxy.url)["ridgeline_front_client_left_total"] == 1
        assert complete(router.url, LONG_PROMPT) == expected[LONG_PROMPT]


# ---------------------------------------------------------------------------------------------- deadlines


def test_a_deadline_drops_the_request_wherever_it_is_with_a_504(disaggregated, expected):
    """x-ridgeline-deadline-ms: a request queued behind a stuck prefill engine is dropped when it passes, answered
    504 deadline_exceeded, and nothing of it is left on any worker; a malformed value is a 400 naming the header."""
    proxy, prefill, decode, _ = disaggregated
    with driver(prefill).engine_lock:
        started = time.monotonic()
        late = httpx.post(f"{proxy.url}/v1/completions", json=body(), headers={"x-ridgeline-deadline-ms": "300"},
                          timeout=30)
        assert time.monotonic() - started < 5
    assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    settled(prefill, decode)
    assert metrics(proxy.url)["ridgeline_front_deadline_exceeded_total"] == 1
    bad = httpx.post(f"{proxy.url}/v1/completions", json=body(), headers={"x-ridgeline-deadline-ms": "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-ridgeline-deadline-ms"
    on_time = httpx.post(f"{proxy.url}/v1/completions", json=body(), headers={"x-ridgeline-deadline-ms": "60000"},
                         timeout=60)
    assert on_time.json()["choices"][0]["text"] == expected[PROMPT]


def test_a_deadline_that_passes_mid_stream_ends_it_with_the_error_and_frees_the_worker():
    engine = tiny_engine()
    with serve(engine=engine) as worker:
        events = []
        with httpx.stream("POST", f"{worker.url}/v1/completions", json=body(max_tokens=480, stream=True),
                          headers={"x-ridgeline-deadline-ms": "400"}, timeout=30) as response:
            assert response.status_code == 200
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        last = json.loads(events[-2].removeprefix("data: "))
        assert events[-1] == "data: [DONE]" and last["error"]["code"] == "deadline_exceeded"
        settled(worker)
        m = metrics(worker.url)
        assert m["ridgeline_requests_deadline_exceeded_total"] == 1 and m["ridgeline_generation_tokens_total"] < 480
