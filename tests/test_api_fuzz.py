"""API fuzzing (schemathesis) against the tiny model's server, from the server's own OpenAPI document: a short
fixed-seed run over every endpoint, valid and invalid requests. Nothing may get a 5xx, hang or lose its
connection; every 4xx is an OpenAI-style error; afterwards the server is healthy and holds no KV pages."""

import json
import threading

import httpx
import pytest
from server_helpers import serve_tiny_model

pytest.importorskip("schemathesis")
from fuzz.api_fuzz import fuzz_api  # noqa: E402

EXAMPLES_PER_OPERATION_AND_MODE = 12


def kv_pages(server_url: str) -> tuple[float, float]:
    """(free, total) KV pages from /metrics, whichever word ("blocks" or "pages") the metric uses."""
    values = {}
    for line in httpx.get(f"{server_url}/metrics").text.splitlines():
        if not line.startswith("#") and line.strip():
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    free = next(v for k, v in values.items() if k.startswith("ridgeline_kv_cache_free_"))
    total = next(v for k, v in values.items() if k.startswith("ridgeline_kv_cache_total_"))
    return free, total


def test_schema_describes_every_endpoint_and_the_openai_fields():
    with serve_tiny_model() as server:
        schema = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize", "/detokenize"} <= set(schema["paths"])
    completion = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"prompt", "max_tokens", "n", "stop", "logprobs", "echo", "seed", "logit_bias", "stream"} <= set(completion)
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "max_completion_tokens", "top_logprobs", "tools", "response_format"} <= set(chat)
    responses = schema["paths"]["/v1/completions"]["post"]["responses"]
    assert "422" not in responses and "400" in responses and "text/event-stream" in responses["200"]["content"]


NORMAL_PROMPTS = [f"Client {i}: the quick brown fox" + " jumps" * i for i in range(8)]


def streamed_text(url: str, prompt: str) -> str:
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True}
    text = ""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


def test_fuzzed_requests_get_2xx_or_openai_4xx_and_leak_nothing(record_property):
    """Beside the fuzzing, 8 normal greedy streaming clients: their outputs equal a quiet run's."""
    with serve_tiny_model(num_blocks=64) as server:
        quiet = [streamed_text(server.url, prompt) for prompt in NORMAL_PROMPTS]
        fuzzing = threading.Event()
        fuzzing.set()
        noisy: list[list[str]] = [[] for _ in NORMAL_PROMPTS]

        def normal_client(i: int) -> None:
            while fuzzing.is_set() or not noisy[i]:
                try:
                    noisy[i].append(streamed_text(server.url, NORMAL_PROMPTS[i]))
                except Exception as error:  # noqa: BLE001 - recorded as a wrong output, reported below
                    noisy[i].append(f"client failed: {error!r}")
                    return

        clients = [threading.Thread(target=normal_client, args=(i,)) for i in range(len(NORMAL_PROMPTS))]
        for client in clients:
            client.start()
        try:
            report = fuzz_api(server.url, EXAMPLES_PER_OPERATION_AND_MODE, seed=17)
        finally:
            fuzzing.clear()
            for client in clients:
                client.join()
        assert httpx.get(f"{server.url}/health").status_code == 200
        free, total = kv_pages(server.url)
    record_property("requests", report.requests)
    print(f"api fuzz: {report.requests} requests, statuses {dict(sorted(report.by_status.items()))}; "
          f"normal streams beside it: {sum(map(len, noisy))}")
    assert not report.failures, "\n".join(report.failures[:10])
    assert report.requests >= 60  # hypothesis stops early on small input spaces (84 at 8 examples)
    assert all(outputs and outputs == [quiet[i]] * len(outputs) for i, outputs in enumerate(noisy)), noisy
    assert free == total
