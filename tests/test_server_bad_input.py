"""Bad input gets an OpenAI-style error with the right status, and the server keeps serving afterwards."""

import asyncio
import json

import httpx
import pytest

from server_helpers import serve_tiny_model

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_BODY = 32 * 1024


@pytest.fixture(scope="module")
def server():
    with serve_tiny_model(api_key=API_KEY, max_body_bytes=MAX_BODY, max_num_seqs=2, max_waiting=1) as server:
        yield server


@pytest.fixture(scope="module")
def context_len(server) -> int:
    return httpx.get(f"{server.url}/v1/models", headers=AUTH).json()["data"][0]["max_model_len"]


def chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


def completion(**fields) -> dict:
    return {"prompt": "hi", "max_tokens": 2, **fields}


C, CHAT = "/v1/completions", "/v1/chat/completions"

# (case, path, body (dict, or raw bytes), status, param the error must name)
CASES = [
    ("malformed JSON", C, b'{"prompt": "hi", ', 400, None),
    ("body is not an object", C, b"[1, 2, 3]", 400, None),
    ("prompt of wrong type", C, {"prompt": 42}, 400, "prompt"),
    ("temperature of wrong type", C, completion(temperature="hot"), 400, "temperature"),
    ("max_tokens of wrong type", C, completion(max_tokens=2.5), 400, "max_tokens"),
    ("max_tokens as a string", C, completion(max_tokens="2"), 400, "max_tokens"),
    ("stream of wrong type", C, completion(stream="yes"), 400, "stream"),
    ("messages of wrong type", CHAT, {"messages": "hi"}, 400, "messages"),
    ("message without role", CHAT, {"messages": [{"content": "hi"}]}, 400, "messages.0.role"),
    ("message with unknown role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("missing prompt", C, {"max_tokens": 2}, 400, "prompt"),
    ("missing messages", CHAT, {"max_tokens": 2}, 400, "messages"),
    ("unknown model", C, completion(model="no-such-model"), 404, "model"),
    ("unknown model (chat)", CHAT, chat(model="no-such-model"), 404, "model"),
    ("empty prompt", C, completion(prompt=""), 400, "prompt"),
    ("empty prompt list", C, completion(prompt=[]), 400, "prompt"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("token id outside the vocabulary", C, completion(prompt=[1, 10**9]), 400, "prompt"),
    ("negative temperature", C, completion(temperature=-1), 400, "temperature"),
    ("absurd temperature", CHAT, chat(temperature=1e9), 400, "temperature"),
    ("top_p of zero", C, completion(top_p=0), 400, "top_p"),
    ("top_p above one", CHAT, chat(top_p=1.5), 400, "top_p"),
    ("negative max_tokens", C, completion(max_tokens=-1), 400, "max_tokens"),
    ("negative max_completion_tokens", CHAT, chat(max_completion_tokens=-5), 400, "max_completion_tokens"),
    ("n of zero", C, completion(n=0), 400, "n"),
    ("absurd n", CHAT, chat(n=10**6), 400, "n"),
    ("too many logprobs", C, completion(logprobs=1000), 400, "logprobs"),
    ("too many top_logprobs", CHAT, chat(logprobs=True, top_logprobs=1000), 400, "top_logprobs"),
    ("top_logprobs without logprobs", CHAT, chat(top_logprobs=2), 400, None),
    ("presence_penalty out of range", C, completion(presence_penalty=5), 400, "presence_penalty"),
    ("top_k below -1", C, completion(top_k=-5), 400, "top_k"),
    ("min_p above one", C, completion(min_p=2), 400, "min_p"),
    ("repetition_penalty of zero", C, completion(repetition_penalty=0), 400, "repetition_penalty"),
    ("seed beyond 64 bits", C, completion(seed=2**70), 400, "seed"),
    ("priority beyond 32 bits", C, completion(priority=2**40), 400, "priority"),
    ("priority not an integer", CHAT, chat(priority=0.5), 400, "priority"),
    ("empty stop string", C, completion(stop=[""]), 400, "stop"),
    ("stop token id outside the vocabulary", C, completion(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    ("unsupported suffix", C, completion(suffix="tail"), 400, "suffix"),
    ("logit_bias key not a token id", C, completion(logit_bias={"hello": 5.0}), 400, "logit_bias"),
    ("logit_bias key outside the vocabulary", CHAT, chat(logit_bias={"1000000000": 5.0}), 400, "logit_bias"),
    ("logit_bias value beyond 100", C, completion(logit_bias={"1": 150.0}), 400, "logit_bias"),
    ("unsupported best_of", C, completion(best_of=3), 400, None),
    ("tool_choice naming no tool", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                              tool_choice={"type": "function", "function": {"name": "g"}}), 400, "tool_choice"),
    ("tool_choice required without tools", CHAT, chat(tool_choice="required"), 400, "tool_choice"),
    ("tool name with a space", CHAT, chat(tools=[{"type": "function", "function": {"name": "get weather"}}]), 400,
     "tools.0.function.name"),
    ("two tools of one name", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}] * 2), 400,
     "tools.1.function.name"),
    ("forced call with an unsupported parameters schema", CHAT,
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
          tool_choice="required"), 400, "tool_choice"),
    ("unsupported functions", CHAT, chat(functions=[{"name": "f"}]), 400, "functions"),
    ("response_format of an unknown type", CHAT, chat(response_format={"type": "yaml"}), 400, None),
    ("json_schema with a keyword the grammar engine lacks", CHAT,
     chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}),
     400, "response_format"),
    ("regex that does not parse", C, completion(structured_outputs={"regex": "(unclosed"}), 400, "structured_outputs"),
    ("grammar that does not parse", C, completion(guided_grammar="start: ???"), 400, "guided_grammar"),
    ("empty choice", CHAT, chat(guided_choice=[]), 400, "guided_choice"),
    ("two constraints at once", C, completion(guided_regex="a+", guided_choice=["a"]), 400, None),
    ("guided_json that is not JSON", C, completion(guided_json="{not json"), 400, "guided_json"),
    ("image content", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages.0.content"),
    ("stream_options without stream", C, completion(stream_options={"include_usage": True}), 400, None),
]


def post(server, path: str, body, headers=AUTH) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, headers={"Content-Type": "application/json", **headers})


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if param is not None:
        assert error["param"] == param, error
    return error


def assert_serving(server) -> None:
    response = post(server, C, completion())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("case, path, body, status, param", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_an_openai_error_and_the_server_keeps_serving(server, case, path, body, status, param):
    assert_error(post(server, path, body), status, param)
    assert_serving(server)


def test_prompt_plus_max_tokens_beyond_the_context(server, context_len):
    error = assert_error(post(server, C, completion(max_tokens=context_len)), 400, "max_tokens")
    assert error["code"] == "context_length_exceeded"
    assert_error(post(server, CHAT, chat(max_completion_tokens=context_len)), 400, "max_completion_tokens")
    assert_serving(server)


def test_prompt_alone_beyond_the_context(server, context_len):
    error = assert_error(post(server, C, completion(prompt=[1] * context_len, max_tokens=None)), 400, "prompt")
    assert error["code"] == "context_length_exceeded"
    assert_serving(server)


def test_oversized_body_is_413(server):
    big = completion(prompt="word " * MAX_BODY)
    assert_error(post(server, C, big), 413)

    def chunked():  # no Content-Length: the limit must hold while the body streams in
        yield json.dumps(big).encode()

    response = httpx.post(f"{server.url}{C}", content=chunked(), headers={"Content-Type": "application/json", **AUTH})
    assert_error(response, 413)
    assert_serving(server)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}])
def test_missing_or_wrong_api_key_is_401(server, headers):
    assert_error(post(server, C, completion(), headers=headers), 401)
    assert httpx.get(f"{server.url}/v1/models", headers=headers).status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # probes need no key
    assert_serving(server)


def test_unknown_route_and_wrong_method(server):
    assert_error(httpx.get(f"{server.url}/v1/nothing-here", headers=AUTH), 404)
    assert_error(httpx.get(f"{server.url}{C}", headers=AUTH), 405)
    assert_serving(server)


def test_past_the_waiting_queue_requests_get_503_with_retry_after(server):
    """max_num_seqs=2 running + max_waiting=1 queued: the fourth concurrent request is refused, not queued."""

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60) as client:
            long = completion(max_tokens=400, ignore_eos=True, stream=True)  # still running when the 4th arrives
            streams = [client.stream("POST", C, json=long) for _ in range(3)]
            responses = [await s.__aenter__() for s in streams]
            assert [r.status_code for r in responses] == [200, 200, 200]
            refused = await client.post(C, json=completion())
            for stream in streams:
                await stream.__aexit__(None, None, None)
            return refused

    refused = asyncio.run(scenario())
    assert_error(refused, 503)
    assert int(refused.headers["Retry-After"]) >= 1
    assert_serving(server)


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize("body, param", [
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": _nested(300)}}),
     "response_format"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": _nested(300)}}]), "tools.0.function.parameters"),
    (completion(guided_json=json.dumps(_nested(300))), "guided_json"),
    (completion(structured_outputs={"regex": r"[^\s\S]"}), "structured_outputs"),  # matches no text at all
    (chat(tools=[{"type": "function", "function": {"description": "no name"}}]), "tools.0.function.name"),
], ids=["nested 300 deep", "a tool's parameters nested 300 deep", "guided_json text nested 300 deep",
        "a regex that matches nothing", "a tool with no name"])
def test_hostile_constraints_are_refused_quickly_naming_their_field(server, body, param):
    path = CHAT if "messages" in body else C
    assert_error(post(server, path, body), 400, param)
    ok = post(server, CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "ok", "schema": _nested(30)}},
                                 max_tokens=2))
    assert ok.status_code == 200  # a deep but sane schema is served, and the server is unharmed
