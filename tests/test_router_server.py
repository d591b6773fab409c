"""The router's OpenAI endpoint over two tiny in-process models and one OpenAI-compatible server (a tiny ridgeline
server over HTTP), through the `openai` client: model list, named models, `auto`, 429/503 and dead backends."""

import asyncio

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from cluster_helpers import TEST_RATES, local_group
from ridgeline.cluster.http_replica import HttpReplica
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.server.launcher import BackgroundServer
from ridgeline.server.router_app import create_router_app
from server_helpers import serve_tiny_model


def busy_app() -> FastAPI:
    """A backend that is up but refuses work: 503 with Retry-After."""
    app = FastAPI()

    @app.get("/health")
    async def health():
        return JSONResponse({})

    @app.post("/{path:path}")
    async def refuse(path: str):
        return JSONResponse({"error": {"message": "busy"}}, status_code=503, headers={"Retry-After": "30"})

    return app


@pytest.fixture(scope="module")
def stack():
    with serve_tiny_model() as remote, BackgroundServer(busy_app()) as busy:
        holder = {}

        async def build() -> Router:
            small = local_group("small", replicas=2, quality=0.3)
            large = local_group("large", replicas=1, quality=0.8)
            # Listed busy first, and a dead address second: requests must get past both to the live server.
            remote_group = ModelGroup("remote", 0.5, [HttpReplica(f"remote/{i}", "remote", url, served_name="tiny-llama")
                                                      for i, url in enumerate([busy.url, "http://127.0.0.1:9", remote.url])])
            groups = [small, large, remote_group]
            rates = {r.name: Rates(*TEST_RATES, "configured") for g in groups for r in g.replicas}
            rates["large/0"] = Rates(TEST_RATES[0] / 5, TEST_RATES[1] / 5, "configured")  # five times slower
            for replica in remote_group.replicas:  # slower than small and better than it only a little: `auto` skips it
                rates[replica.name] = Rates(TEST_RATES[0] / 3, TEST_RATES[1] / 3, "configured")
            router = Router(groups, rates, threshold=0.05, health_interval_s=3600, learn_rates=False)
            await router.start()
            holder["router"] = router
            return router

        with BackgroundServer(create_router_app(build)) as server:
            yield server, holder["router"]


def test_models_lists_every_model_and_auto(stack):
    server, _ = stack
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    assert [m.id for m in client.models.list().data] == ["auto", "small", "large", "remote"]


def test_a_named_model_is_served_by_it(stack):
    server, router = stack
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    before = router.loads.of("large/0").sent
    # ignore_eos: the random model's end token could come first and cut the count (or the text) short.
    reply = client.chat.completions.create(model="large", messages=[{"role": "user", "content": "the quick fox"}],
                                           max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert reply.model == "large" and reply.usage.completion_tokens == 5
    assert router.loads.of("large/0").sent == before + 1
    chunks = list(client.completions.create(model="small", prompt="decode is", max_tokens=4, stream=True, temperature=0,
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_auto_routes_short_prompts_small_and_long_hard_ones_large_and_counts_why(stack):
    server, _ = stack
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    short = client.completions.create(model="auto", prompt="hi", max_tokens=3)
    hard = "Explain step by step why the cache must be invalidated, and derive the bound. " * 6
    long = client.completions.create(model="auto", prompt=hard, max_tokens=3)
    assert short.model == "small" and long.model == "large"
    metrics = httpx.get(server.url + "/metrics").text
    assert 'ridgeline_router_auto_decisions_total{kind="cost",model="small"}' in metrics
    assert 'ridgeline_router_auto_decisions_total{kind="quality_worth_cost",model="large"}' in metrics
    assert "ridgeline_router_decision_seconds_count" in metrics


def test_openai_backend_past_a_busy_and_a_dead_replica(stack):
    server, router = stack
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    # ignore_eos: a random model's sample can be its end token, and the counts below are about the relay, not it.
    reply = client.chat.completions.create(model="remote", messages=[{"role": "user", "content": "the fox"}],
                                           max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens == 4
    assert router.health["remote/0"].up and not router.health["remote/0"].usable()  # busy: Retry-After honoured
    assert not router.health["remote/1"].up  # dead: its first health check took it out, so it was never tried
    def failovers() -> list[float]:
        return [router.metrics.failovers.labels("remote", f"remote/{i}")._value.get() for i in range(2)]

    assert failovers() == [1.0, 0.0]
    client.chat.completions.create(model="remote", messages=[{"role": "user", "content": "again"}], max_tokens=2)
    assert failovers() == [1.0, 0.0]  # the busy one is not tried again before its Retry-After
    # The relayed stream is the backend's: greedy, its text is the whole answer's, and it ends with the usage.
    # (Chunks are not counted: a token that ends mid-character sends no text until the character completes.)
    ask = dict(model="remote", messages=[{"role": "user", "content": "fox"}], max_tokens=3, temperature=0,
               extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3


def test_unknown_model_and_bad_body_are_clear_4xx(stack):
    server, _ = stack
    response = httpx.post(server.url + "/v1/chat/completions", json={"model": "nope", "messages": []})
    assert response.status_code == 404 and "auto" in response.json()["error"]["message"]
    response = httpx.post(server.url + "/v1/completions", content=b"{not json")
    assert response.status_code == 400
    response = httpx.post(server.url + "/v1/completions", json={"model": "small", "prompt": "x", "max_tokens": -1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"


def test_no_replica_up_is_a_503_with_retry_after(stack):
    server, router = stack
    for replica in router.groups["large"].replicas:
        router.health[replica.name].failed("test")
    try:
        response = httpx.post(server.url + "/v1/completions", json={"model": "large", "prompt": "x", "max_tokens": 2})
        assert response.status_code == 503 and response.headers["retry-after"]
    finally:
        for replica in router.groups["large"].replicas:
            router.health[replica.name].passed()


# ------------------------------------------------------------------ busy backends (a disaggregated front's 503s)


def refusing_app(status: int, retry_after: str, code: str, calls: list) -> FastAPI:
    """A backend that is up and refuses every request as a disaggregated front does when its decode side is full:
    `status` with Retry-After and an OpenAI error body naming why. Counts the requests it saw in `calls`."""
    app = FastAPI()

    @app.get("/health")
    async def health():
        return JSONResponse({})

    @app.post("/{path:path}")
    async def refuse(path: str):
        calls.append(path)
        return JSONResponse({"error": {"message": "the decode worker takes no more now; retry later",
                                       "type": "server_error", "param": None, "code": code}},
                            status_code=status, headers={"Retry-After": retry_after})

    return app


def answering_app(calls: list, reprefills: int | None = 1) -> FastAPI:
    """A backend that answers every completion (a canned one) and, unless `reprefills` is None, says it re-prefilled
    it that many times."""
    app = FastAPI()

    @app.get("/health")
    async def health():
        return JSONResponse({})

    @app.post("/{path:path}")
    async def answer(path: str):
        calls.append(path)
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "stub",
                             "choices": [{"index": 0, "text": " ok", "finish_reason": "length", "logprobs": None}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
                            headers={} if reprefills is None else {"x-ridgeline-reprefills": str(reprefills)})

    return app


@pytest.fixture(scope="module")
def busy_stack():
    calls = {"busy": [], "throttled": [], "busy-of-two": [], "live": []}
    with BackgroundServer(refusing_app(503, "7", "decode_busy", calls["busy"])) as busy, \
            BackgroundServer(refusing_app(429, "3", "rate_limited", calls["throttled"])) as throttled, \
            BackgroundServer(refusing_app(503, "30", "decode_busy", calls["busy-of-two"])) as busy_of_two, \
            BackgroundServer(answering_app(calls["live"])) as live:

        async def build() -> Router:
            groups = [ModelGroup("front", 0.5, [HttpReplica("front/0", "front", busy.url)]),
                      ModelGroup("limited", 0.5, [HttpReplica("limited/0", "limited", throttled.url)]),
                      # The busy replica listed first: the request must get past it to the one that answers.
                      ModelGroup("fronts", 0.5, [HttpReplica("fronts/0", "fronts", busy_of_two.url),
                                                 HttpReplica("fronts/1", "fronts", live.url)])]
            rates = {r.name: Rates(*TEST_RATES, "configured") for g in groups for r in g.replicas}
            router = Router(groups, rates, health_interval_s=3600, learn_rates=False)
            await router.start()
            return router

        with BackgroundServer(create_router_app(build)) as server:
            yield server, calls


def test_a_busy_backend_alone_is_passed_on_as_its_503_and_retry_after_never_a_4xx_or_502(busy_stack):
    """The only replica of a model (a disaggregated front) answers 503 + Retry-After: 7 (its decode side full). The
    client gets that 503, its body and its Retry-After; streamed or not; and while the replica is busy the router
    answers 503 with the time left of its Retry-After itself, without sending it more."""
    server, calls = busy_stack
    body = {"model": "front", "prompt": "the fox", "max_tokens": 4}
    refused = httpx.post(server.url + "/v1/completions", json=body)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "7"
    assert refused.json()["error"]["code"] == "decode_busy"
    assert len(calls["busy"]) == 1
    again = httpx.post(server.url + "/v1/completions", json={**body, "stream": True})
    assert again.status_code == 503 and 1 <= int(again.headers["retry-after"]) <= 7
    assert again.json()["error"]["code"] == "no_backend_available"
    assert len(calls["busy"]) == 1  # its Retry-After is honoured
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as raised:
            client.completions.create(**body)
        assert raised.value.status_code == 503
    # Each of the three refusals counted, so a load's client-side refusals can be checked against /metrics.
    assert 'ridgeline_router_refusals_total{model="front",status="503"} 3.0' in httpx.get(server.url + "/metrics").text


def test_a_backend_429_is_passed_on_as_a_429_with_its_retry_after(busy_stack):
    server, calls = busy_stack
    refused = httpx.post(server.url + "/v1/chat/completions",
                         json={"model": "limited", "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    assert refused.json()["error"]["code"] == "rate_limited" and len(calls["throttled"]) == 1
    assert 'ridgeline_router_refusals_total{model="limited",status="429"} 1.0' in httpx.get(server.url + "/metrics").text


def test_a_busy_backend_with_another_replica_is_skipped_for_it(busy_stack):
    """Of two replicas the first answers 503 + Retry-After: the request goes to the other, which answers it (its
    x-ridgeline-* headers passed on); the busy one is left alone for its Retry-After."""
    server, calls = busy_stack
    for _ in range(2):
        answered = httpx.post(server.url + "/v1/completions", json={"model": "fronts", "prompt": "x", "max_tokens": 1})
        assert answered.status_code == 200 and answered.json()["choices"][0]["text"] == " ok"
        assert answered.headers["x-ridgeline-reprefills"] == "1"
    assert len(calls["busy-of-two"]) == 1 and len(calls["live"]) == 2
