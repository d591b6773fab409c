"""Hostile requests to a live server (tiny model): invalid Unicode, over-long prompts, work beyond the KV pool,
stop strings and logprobs at and past their limits, hostile chat templates, and idle slow connections.
Each is answered or refused with an OpenAI-style 4xx naming the field, and never starves other clients."""

import concurrent.futures
import socket
import time

import httpx
import pytest
from server_helpers import serve_tiny_model, tiny_engine
from test_api_fuzz import kv_pages

from ridgeline.model.tokenizer import template_sandbox
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.launcher import BackgroundServer

READ_TIMEOUT = 1.0  # seconds the server gives a client to send its request (production: 20)


@pytest.fixture(scope="module")
def server():
    with serve_tiny_model(num_blocks=64, request_read_timeout=READ_TIMEOUT) as running:
        yield running


def post(server, path: str, body: str | dict) -> httpx.Response:
    if isinstance(body, dict):
        return httpx.post(server.url + path, json=body, timeout=120)
    return httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=120)


def assert_refused(response: httpx.Response, param: str | None, *fragments: str, code: str | None = None) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    for fragment in fragments:
        assert fragment in error["message"], error
    if code:
        assert error["code"] == code


SURROGATES = {
    "prompt": ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt", "U+D800) at character 1"),
    "prompt_list": ("/v1/completions", '{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt", "[1] holds"),
    "chat_part": ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
                  "messages", "[0]['content'][0]['text'] holds"),
    "stop": ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "stop": ["x", "\\udbff"]}', "stop", "U+DBFF"),
    "logit_bias_key": ("/v1/completions", '{"prompt": "hi", "logit_bias": {"\\ud800": 1}}', "logit_bias", "key #0 holds"),
    "tokenize": ("/tokenize", '{"prompt": "\\ud800"}', "prompt", "unpaired UTF-16 surrogate"),
}


@pytest.mark.parametrize("case", SURROGATES)
def test_lone_surrogates_are_refused_naming_the_field(server, case):
    path, body, param, fragment = SURROGATES[case]
    assert_refused(post(server, path, body), param, fragment, "must be valid Unicode")


def test_arbitrary_bytes_are_a_json_error_not_a_crash(server):
    for body in (b"\xff\xfe\x00garbage", b'{"prompt": "\xc3\x28"}', b'{"prompt": "ok", "stop": ["\xed\xa0\x80"]}'):
        response = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_a_prompt_longer_than_the_context_is_refused(server):
    response = post(server, "/v1/completions", {"prompt": "fox " * 2000, "max_tokens": 1})
    assert_refused(response, "prompt", "context", code="context_length_exceeded")


def test_thousands_of_stop_strings_or_one_huge_one_are_refused(server):
    many = post(server, "/v1/completions", {"prompt": "hi", "stop": [f"s{i}" for i in range(5000)]})
    assert_refused(many, "stop", "at most 16 strings")
    huge = post(server, "/v1/completions", {"prompt": "hi", "stop": ["x" * 100_000]})
    assert_refused(huge, "stop", "at most 256 characters")


def test_logprobs_at_the_limit_are_answered_and_past_it_refused(server):
    at_limit = post(server, "/v1/completions", {"prompt": "The fox " * 50, "max_tokens": 4, "logprobs": 20, "echo": True})
    assert at_limit.status_code == 200, at_limit.text
    logprobs = at_limit.json()["choices"][0]["logprobs"]
    # Keyed by token text, as OpenAI's legacy format is: ids that decode alike (byte pieces) share a key.
    assert all(0 < len(top) <= 20 for top in logprobs["top_logprobs"][1:])
    assert sum(len(top) for top in logprobs["top_logprobs"][1:]) > 10 * (len(logprobs["top_logprobs"]) - 1)
    assert_refused(post(server, "/v1/completions", {"prompt": "hi", "logprobs": 21}), "logprobs", "must be in [0, 20]")
    chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "max_tokens": 2}
    assert post(server, "/v1/chat/completions", {**chat, "top_logprobs": 20}).status_code == 200
    assert_refused(post(server, "/v1/chat/completions", {**chat, "top_logprobs": 21}), "top_logprobs", "must be in [0, 20]")


def test_n_times_max_tokens_beyond_the_kv_pool_is_served_without_starving_a_small_request(server):
    # 64 pages of 16 tokens hold ~3 of these sequences at full length: the six take turns (preemption).
    big = {"prompt": "Once upon a time", "n": 6, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    small = {"prompt": "The fox", "max_tokens": 4, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        big_future = pool.submit(post, server, "/v1/completions", big)
        time.sleep(0.3)
        small_response = post(server, "/v1/completions", small)
        small_done = big_future.done()
        big_response = big_future.result()
    assert small_response.status_code == 200 and not small_done  # answered while the big one still ran
    assert big_response.status_code == 200
    choices = big_response.json()["choices"]
    assert len(choices) == 6 and all(c["finish_reason"] == "length" for c in choices)
    assert len({c["text"] for c in choices}) == 1  # greedy: preemption and recompute change nothing
    free, total = kv_pages(server.url)
    assert free == total


def test_idle_slow_connections_are_closed_and_do_not_starve_others(server):
    host, port = server.url.removeprefix("http://").split(":")
    slow = []
    for i in range(300):  # slowloris: a request head that never ends
        conn = socket.create_connection((host, int(port)))
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"GET /health HTTP/1.1\r\n")
        slow.append(conn)
    body_drip = socket.create_connection((host, int(port)))  # a whole head, then a body that never comes
    body_drip.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    slow.append(body_drip)
    try:
        response = post(server, "/v1/completions", {"prompt": "The fox", "max_tokens": 3})
        assert response.status_code == 200
        for conn in slow:
            conn.settimeout(READ_TIMEOUT + 10)
            data = conn.recv(4096)
            assert data == b"" or b" 200 " not in data  # closed by the server, nothing served
    finally:
        for conn in slow:
            conn.close()
    assert httpx.get(server.url + "/health").status_code == 200


HOSTILE_TEMPLATES = {
    "escape": ("{{ cycler.__init__.__globals__.os.system('id') }}", "unsafe"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion too deep"),
    "memory": ("{{ 'x' * 10**10 }}", "needed more than"),
    "time": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "took longer than"),
}


def test_hostile_chat_templates_get_a_clear_400_and_the_server_keeps_serving(monkeypatch):
    monkeypatch.setattr(template_sandbox._worker, "render_seconds", 0.5)
    engine = tiny_engine(num_blocks=32)
    with BackgroundServer(create_app(engine, ServerConfig())) as running:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for template, fragment in HOSTILE_TEMPLATES.values():
            engine.tokenizer.chat_template = template
            assert_refused(post(running, "/v1/chat/completions", chat), None, "chat template failed", fragment)
        engine.tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
        assert post(running, "/v1/chat/completions", chat).status_code == 200


@pytest.mark.parametrize("key", ["\u00b2", "9" * 5000, "abc", "\u0663", "1_0", "-1", "999999", ""])
def test_logit_bias_keys_that_are_not_token_ids_are_refused(server, key):
    # '²' and 5,000 digits pass str.isdigit() but not int(): they were a 500 (StopIteration).
    response = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "logit_bias": {key: 1}})
    assert_refused(response, "logit_bias")
