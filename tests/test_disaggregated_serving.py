"""Disaggregated serving end to end: `ridgeline proxy` in front of a prefill worker and a decode worker (real
servers on loopback, the official `openai` client), against a colocated server on the same tiny model. Greedy
answers, streamed or whole, chat or completions, are the colocated ones; usage counts the same; KV pages moved
between the workers; and every failure -- a dead prefill worker, one killed while its pages stream, a client gone
between prefill and decode, a decode worker killed mid-stream -- ends in an explicit error with no page leaked on
any worker."""

import contextlib
import json
import re
import threading
import time

import httpx
import openai
import pytest

from server_helpers import serve_tiny_model_process, tiny_engine

from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
from ridgeline.server.launcher import BackgroundServer

PROMPTS = ["The quick brown fox jumps over the lazy dog " * 3, "Once upon a time there was a tiny model",
           "The quick brown fox jumps over the lazy dog " * 3 + "and then it ran", "a b c d e f g h i j k l m n o p"]


def serve(role: str = "both", **options):
    return BackgroundServer(create_app(tiny_engine(), ServerConfig(role=role, **options)))


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith((name + "{", name + " ")))


def assert_no_pages_leaked(*urls: str) -> None:
    for url in urls:
        assert metric(url, "ridgeline_kv_cache_free_pages") == metric(url, "ridgeline_kv_cache_total_pages"), url


@pytest.fixture(scope="module")
def cluster():
    with serve("prefill") as prefill, serve("decode") as decode, serve() as colocated:
        front = create_front_app(FrontConfig((prefill.url,), (decode.url,), local_prefill_tokens=1))
        with BackgroundServer(front) as proxy:
            yield prefill.url, decode.url, colocated.url, proxy.url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def completion_text(url: str, prompt: str, stream: bool, **extra) -> tuple[str, object]:
    api = client(url)
    kwargs = dict(model=api.models.list().data[0].id, prompt=prompt, max_tokens=10, temperature=0,
                  extra_body={"ignore_eos": True}, **extra)
    if not stream:
        response = api.completions.create(**kwargs)
        return response.choices[0].text, response.usage
    chunks = list(api.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_completions_through_the_front_equal_colocated(cluster, stream):
    prefill, decode, colocated, proxy = cluster
    received_before = metric(decode, "ridgeline_kv_transfer_pages_received_total")
    for prompt in PROMPTS:
        assert completion_text(proxy, prompt, stream) == completion_text(colocated, prompt, stream)
    assert metric(decode, "ridgeline_kv_transfer_pages_received_total") > received_before
    assert metric(proxy, "ridgeline_front_prefills_total") >= len(PROMPTS)
    assert_no_pages_leaked(prefill, decode)
    assert metric(prefill, "ridgeline_kv_held_requests") == 0


def test_chat_with_logprobs_and_stop_strings_equals_colocated(cluster):
    prefill, decode, colocated, proxy = cluster

    def ask(url: str):
        api = client(url)
        response = api.chat.completions.create(
            model=api.models.list().data[0].id, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=12,
            temperature=0, logprobs=True, top_logprobs=2, stop=["zz"], extra_body={"ignore_eos": True})
        choice = response.choices[0]
        return (choice.message.content, choice.finish_reason, response.usage.completion_tokens,
                [(e.token, round(e.logprob, 4), [t.token for t in e.top_logprobs]) for e in choice.logprobs.content])

    assert ask(proxy) == ask(colocated)
    assert_no_pages_leaked(prefill, decode)


def test_constrained_answers_through_the_front_equal_colocated(cluster):
    """The prefill worker samples the first token under the grammar and the decode worker's grammar takes it, so
    a regex holds across the hand-off, and a schema's answer is the colocated one."""
    prefill, decode, colocated, proxy = cluster
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}}, "required": ["ok", "n"]}
    for extra in ({"guided_regex": "[a-c]{3}-[0-9]{2}"}, {"guided_json": schema}):
        api = {url: client(url) for url in (proxy, colocated)}
        texts = [api[url].completions.create(model=api[url].models.list().data[0].id, prompt=PROMPTS[1], max_tokens=40,
                                             temperature=0, extra_body=extra).choices[0].text for url in (proxy, colocated)]
        assert texts[0] == texts[1]
        if "guided_regex" in extra:
            assert re.fullmatch("[a-c]{3}-[0-9]{2}", texts[0])
        else:
            assert set(json.loads(texts[0])) == {"ok", "n"}
    assert_no_pages_leaked(prefill, decode)


def test_a_forced_tool_call_through_the_front_equals_colocated():
    """Tools reach the prefill worker's template and the front's sizing of the prompt (/tokenize renders them), and
    the call's grammar holds across the hand-off. A longer context: the tool listing is most of 512 tokens here."""
    tools = [{"type": "function", "function": {"name": "rate", "parameters": {
        "type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, "required": ["n"]}}}]

    def serve_long(role: str = "both"):
        return BackgroundServer(create_app(tiny_engine(context=2048, num_blocks=512), ServerConfig(role=role)))

    with serve_long("prefill") as prefill, serve_long("decode") as decode, serve_long() as colocated:
        front = create_front_app(FrontConfig((prefill.url,), (decode.url,), local_prefill_tokens=1))
        with BackgroundServer(front) as proxy:
            calls = []
            for url in (proxy.url, colocated.url):
                api = client(url)
                answer = api.chat.completions.create(
                    model=api.models.list().data[0].id, messages=[{"role": "user", "content": "go"}], tools=tools,
                    tool_choice="required", parallel_tool_calls=False, max_tokens=120, temperature=0).choices[0]
                assert answer.finish_reason == "tool_calls"
                calls.append([(c.function.name, c.function.arguments) for c in answer.message.tool_calls])
            assert calls[0] == calls[1] and calls[0][0][0] == "rate"
            assert metric(decode.url, "ridgeline_kv_transfer_pages_received_total") > 0  # it went through P/D
            assert_no_pages_leaked(prefill.url, decode.url)


def test_a_prefill_worker_gone_before_the_pull_fails_the_request_cleanly():
    with serve("decode") as decode:
        with serve("prefill") as prefill:
            answer = httpx.post(f"{prefill.url}/v1/completions", json={
                "prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0,
                "kv_transfer_params": {"do_remote_decode": True}}).json()
        kv = answer["kv_transfer_params"]  # the prefill worker is gone now
        started = time.monotonic()
        failed = httpx.post(f"{decode.url}/v1/completions", json={
            "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0,
            "kv_transfer_params": {**kv, "do_remote_prefill": True}}, timeout=30)
        assert time.monotonic() - started < 20  # the fetch deadline is 30 s: the failure came first
        # The request was valid and its pages are gone: a 503 a front answers by prefilling again.
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "kv_pages_gone"
        assert failed.headers["retry-after"]
        assert metric(decode.url, "ridgeline_kv_transfers_failed_total") == 1
        assert_no_pages_leaked(decode.url)


def wait_for(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prefill_worker_killed_mid_transfer_fails_the_request_cleanly(stream):
    """The prefill worker's link is paced at 1 byte/s: its first page leaves at once, the next would take minutes,
    so "mid-transfer" is a state the test sees (pages sent > 0 on the prefill worker's /metrics), not a guess.
    Killed there, the decode worker's socket monitor sees the connection drop and answers 503 kv_pages_gone (a
    stream starts only once the pages are in, so it is a status too); the front prefills again, finds no prefill
    worker, and the client gets an explicit 503 with Retry-After, long before the 30 s fetch deadline. The decode
    worker holds no page for the request."""
    with serve("decode") as decode, serve_tiny_model_process("--role", "prefill", "--kv-link-rate", "1") as (process, prefill):
        with BackgroundServer(create_front_app(FrontConfig((prefill,), (decode.url,), local_prefill_tokens=1))) as proxy:
            outcome: dict = {}

            def ask() -> None:
                try:
                    outcome["answer"] = completion_text(proxy.url, PROMPTS[0], stream)
                except openai.APIError as error:
                    outcome["error"] = error

            asking = threading.Thread(target=ask)
            asking.start()
            wait_for(lambda: metric(prefill, "ridgeline_kv_transfer_pages_sent") >= 1)
            assert metric(decode.url, "ridgeline_kv_cache_free_pages") < metric(decode.url, "ridgeline_kv_cache_total_pages")
            process.kill()
            killed = time.monotonic()
            asking.join(timeout=60)
            assert not asking.is_alive(), "the client is still waiting"
            assert time.monotonic() - killed < 15, "the failure must come from the dropped link, not a deadline"
            assert metric(proxy.url, "ridgeline_front_reprefills_total") == 1
        assert "answer" not in outcome
        assert outcome["error"].status_code == 503 and outcome["error"].response.headers["retry-after"]
        assert metric(decode.url, "ridgeline_kv_transfers_failed_total") == 1
        assert_no_pages_leaked(decode.url)


@contextlib.contextmanager
def decode_worker_without_room(monkeypatch):
    """A decode worker whose engine says "no room" to remote KV until `room` is set (with a prefill worker whose
    lease on pages is 1 s, kept alive every 0.25 s: waiting for room outlasts the lease many times over)."""
    engine = tiny_engine()
    room = threading.Event()
    reserve = engine.scheduler.reserve_prefilled
    monkeypatch.setattr(engine.scheduler, "reserve_prefilled", lambda seq: room.is_set() and reserve(seq))
    with BackgroundServer(create_app(engine, ServerConfig(role="decode"))) as decode:
        yield decode, room


def ask_in_background(url: str, prompt: str) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["answer"] = completion_text(url, prompt, stream=False)[0]
        except openai.APIError as error:
            outcome["error"] = error

    asking = threading.Thread(target=ask)
    asking.start()
    return asking, outcome


def test_a_request_waiting_for_room_on_the_decode_worker_keeps_its_prefill_pages(cluster, monkeypatch):
    """A decode worker full of work (a burst of long prompts) may take longer to find room for a request than the
    prefill worker's lease on its pages lasts. While it waits it says so (KeepAlive), so the lease never lapses, and
    once room comes the request is answered as colocated."""
    _, _, colocated, _ = cluster
    with decode_worker_without_room(monkeypatch) as (decode, room), serve("prefill", kv_lease_seconds=1.0) as prefill:
        with BackgroundServer(create_front_app(FrontConfig((prefill.url,), (decode.url,), local_prefill_tokens=1))) as proxy:
            asking, outcome = ask_in_background(proxy.url, PROMPTS[2])
            wait_for(lambda: metric(prefill.url, "ridgeline_kv_held_requests") == 1)
            time.sleep(3.0)  # three leases
            assert metric(prefill.url, "ridgeline_kv_held_requests") == 1, "the lease lapsed while the request waited"
            room.set()
            asking.join(timeout=60)
        assert outcome.get("answer") == completion_text(colocated, PROMPTS[2], stream=False)[0], outcome.get("error")
        assert_no_pages_leaked(prefill.url, decode.url)


def test_a_prefill_worker_lost_while_the_request_waits_for_room_fails_it_at_once(monkeypatch):
    with decode_worker_without_room(monkeypatch) as (decode, room), contextlib.ExitStack() as prefill_alive:
        prefill = prefill_alive.enter_context(serve("prefill", kv_lease_seconds=2.0))  # kept alive every 0.5 s
        with BackgroundServer(create_front_app(FrontConfig((prefill.url,), (decode.url,), local_prefill_tokens=1))) as proxy:
            asking, outcome = ask_in_background(proxy.url, PROMPTS[2])
            wait_for(lambda: metric(prefill.url, "ridgeline_kv_held_requests") == 1)
            time.sleep(0.5)  # the request waits for room on the decode worker
            prefill_alive.close()  # and the prefill worker holding its pages goes away
            gone = time.monotonic()
            asking.join(timeout=30)
            assert not asking.is_alive(), "the client is still waiting"
            assert time.monotonic() - gone < 10, "the failure must come from the next keep-alive, not a deadline"
            assert metric(proxy.url, "ridgeline_front_reprefills_total") == 1  # tried again: no prefill worker
        assert "answer" not in outcome
        assert outcome["error"].status_code == 503 and outcome["error"].response.headers["retry-after"]
        room.set()  # the request's deferred intake went with it: nothing is reserved for it later
        time.sleep(0.3)
        assert metric(decode.url, "ridgeline_kv_transfers_failed_total") == 1
        assert_no_pages_leaked(decode.url)


def test_the_decode_worker_tokenises_nothing_for_a_remote_prefill(monkeypatch):
    """Tokenising a long prompt is pure Python with the GIL held: on a decode worker it stalls every stream there.
    The front asks the prefill worker to tokenise the prompt for the prefix-cache lookup, and hands the decode
    worker the ids the prefill worker computed (from its manifest) for the request itself."""
    engine = tiny_engine()
    texts = []
    encode = engine.tokenizer.encode
    monkeypatch.setattr(engine.tokenizer, "encode", lambda text, *a, **k: texts.append(text) or encode(text, *a, **k))
    with BackgroundServer(create_app(engine, ServerConfig(role="decode"))) as decode, serve("prefill") as prefill:
        with BackgroundServer(create_front_app(FrontConfig((prefill.url,), (decode.url,), local_prefill_tokens=1))) as proxy:
            with serve() as colocated:
                assert completion_text(proxy.url, PROMPTS[2], stream=False) == \
                    completion_text(colocated.url, PROMPTS[2], stream=False)
            assert metric(decode.url, "ridgeline_kv_transfer_pages_received_total") > 0  # it did go remote
    assert texts == []  # the lookup came as ids from the prefill worker's /tokenize, the request as the manifest's


def test_a_client_gone_between_prefill_and_decode_releases_the_pages(cluster):
    prefill, decode, _, _ = cluster
    answer = httpx.post(f"{prefill}/v1/completions", json={
        "prompt": PROMPTS[2], "max_tokens": 1, "temperature": 0, "kv_transfer_params": {"do_remote_decode": True}}).json()
    assert metric(prefill, "ridgeline_kv_held_requests") == 1
    httpx.post(f"{prefill}/v1/kv/release", json={"request_id": answer["kv_transfer_params"]["manifest"]["request_id"]})
    assert metric(prefill, "ridgeline_kv_held_requests") == 0
    assert_no_pages_leaked(prefill)


def test_the_proxy_moves_only_what_the_decode_workers_prefix_cache_lacks():
    """The proxy asks the decode worker (POST /v1/kv/lookup) how much of the prompt its prefix cache holds. A
    repeated prompt's uncached part is under a block, shorter than the threshold: it is prefilled on the decode
    worker and moves no page. A longer prompt sharing it goes to the prefill worker, and only the blocks the decode
    worker lacks travel. Every answer is the colocated one."""
    prompt = "A prompt only this test sends, about pages and caches and the things that move between workers. "
    longer = prompt + "And then a new ending, long enough to be worth a prefill worker of its own."
    block = 16
    with serve("prefill") as prefill, serve("decode") as decode, serve() as colocated:
        config = FrontConfig((prefill.url,), (decode.url,), local_prefill_tokens=block + 1)
        with BackgroundServer(create_front_app(config)) as proxy:

            def moved() -> tuple[float, float]:
                return (metric(decode.url, "ridgeline_kv_transfer_pages_received_total"),
                        metric(decode.url, "ridgeline_kv_transfer_bytes_received_total"))

            def held(text: str) -> dict:
                return httpx.post(f"{decode.url}/v1/kv/lookup", json={"prompt": text}).json()

            assert held(prompt)["cached_tokens"] == 0
            assert completion_text(proxy.url, prompt, False) == completion_text(colocated.url, prompt, False)
            first_pages, first_bytes = moved()
            tokens = held(prompt)
            assert first_pages == -(-tokens["prompt_tokens"] // block)  # the whole prompt moved
            assert tokens["cached_tokens"] == (tokens["prompt_tokens"] - 1) // block * block

            assert completion_text(proxy.url, prompt, False) == completion_text(colocated.url, prompt, False)
            assert moved() == (first_pages, first_bytes)  # the repeat moved nothing
            placements = [line for line in httpx.get(f"{proxy.url}/metrics").text.splitlines()
                          if line.startswith("ridgeline_front_prefills_total")]
            assert sorted(placements) == ['ridgeline_front_prefills_total{placement="local"} 1.0',
                                          'ridgeline_front_prefills_total{placement="remote"} 1.0']
            assert metric(prefill.url, "ridgeline_kv_transfer_pages_sent") == first_pages

            shared = held(longer)
            assert 0 < shared["cached_tokens"] < shared["prompt_tokens"] - block
            assert completion_text(proxy.url, longer, False) == completion_text(colocated.url, longer, False)
            pages, page_bytes = moved()
            expected = -(-shared["prompt_tokens"] // block) - shared["cached_tokens"] // block
            assert pages - first_pages == expected  # the blocks the decode worker lacked, no more
            assert (page_bytes - first_bytes) / expected == first_bytes / first_pages
        assert_no_pages_leaked(prefill.url, decode.url)


def test_kv_params_on_the_wrong_role_are_refused(cluster):
    _, decode, colocated, _ = cluster
    for url, params in ((colocated, {"do_remote_decode": True}), (decode, {"do_remote_decode": True}),
                        (colocated, {"do_remote_prefill": True})):
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                           "kv_transfer_params": params})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "kv_transfer_params"


def test_a_decode_worker_killed_mid_stream_ends_the_stream_with_an_error():
    with serve("prefill") as prefill, serve_tiny_model_process("--role", "decode") as (process, decode):
        front = create_front_app(FrontConfig((prefill.url,), (decode,), local_prefill_tokens=1))
        with BackgroundServer(front) as proxy:
            api = client(proxy.url)
            stream = api.completions.create(model=api.models.list().data[0].id, prompt=PROMPTS[0], max_tokens=450,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True})
            received = []
            with pytest.raises(openai.APIError, match="decode worker"):
                for chunk in stream:
                    received.append(chunk)
                    if len(received) == 3:
                        process.kill()
            assert len(received) >= 3
        assert_no_pages_leaked(prefill.url)


def test_32_mixed_prompts_on_a_sliding_window_model_equal_colocated(tmp_path):
    """A tiny Gemma 3 (window 8, blocks of 16: sliding groups move only their window's pages): 32 prompts of 3 to
    156 tokens, half sharing prefixes, through the front with the openai client, greedy, equal colocated."""
    from tiny_models import build_hf_model, save_tokenizer

    from ridgeline.engine.kv_cache import KVCacheConfig
    from ridgeline.engine.llm_engine import EngineConfig, LLMEngine

    build_hf_model("gemma3", tmp_path)
    save_tokenizer(tmp_path)

    def gemma_server(role: str):
        engine = LLMEngine(EngineConfig(model=str(tmp_path), kv_cache=KVCacheConfig(16, "fp32", 16 << 20)))
        return BackgroundServer(create_app(engine, ServerConfig(role=role)))

    shared = [(11 * i) % 300 + 5 for i in range(40)]
    prompts = [shared[: 8 + i] + [(7 * i + j) % 300 + 3 for j in range(5 * i)] if i % 2 else
               [(13 * i + 5 * j) % 300 + 3 for j in range(3 + 5 * i)] for i in range(32)]
    with gemma_server("prefill") as prefill, gemma_server("decode") as decode, gemma_server("both") as colocated:
        with BackgroundServer(create_front_app(FrontConfig((prefill.url,), (decode.url,), local_prefill_tokens=1))) as proxy:
            # One client for each side, made once: a client costs tens of milliseconds to build, 64 of them seconds.
            apis = [client(url) for url in (proxy.url, colocated.url)]
            model = apis[0].models.list().data[0].id
            assert apis[1].models.list().data[0].id == model
            for prompt in prompts:
                answers = [api.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                                  extra_body={"ignore_eos": True}).choices[0].text for api in apis]
                assert answers[0] == answers[1], f"prompt of {len(prompt)} tokens"
        assert metric(decode.url, "ridgeline_kv_transfer_pages_received_total") > 0
        assert_no_pages_leaked(prefill.url, decode.url)
