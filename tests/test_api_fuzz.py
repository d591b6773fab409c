"""API fuzzing (schemathesis) against the tiny model's server, from the server's own OpenAPI document: a short
fixed-seed run over every endpoint, valid and invalid requests. Nothing may get a 5xx, hang or lose its
connection; every 4xx is an OpenAI-style error; afterwards the server is healthy and holds no KV pages."""

import httpx
import pytest
from server_helpers import serve_tiny_model

pytest.importorskip("schemathesis")
from fuzz.api_fuzz import fuzz_api  # noqa: E402

EXAMPLES_PER_OPERATION_AND_MODE = 20


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


def test_fuzzed_requests_get_2xx_or_openai_4xx_and_leak_nothing(record_property):
    with serve_tiny_model(num_blocks=64) as server:
        report = fuzz_api(server.url, EXAMPLES_PER_OPERATION_AND_MODE, seed=17)
        assert httpx.get(f"{server.url}/health").status_code == 200
        free, total = kv_pages(server.url)
        ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "The fox", "max_tokens": 3})
    record_property("requests", report.requests)
    print(f"api fuzz: {report.requests} requests, statuses {dict(sorted(report.by_status.items()))}")
    assert not report.failures, "\n".join(report.failures[:10])
    assert report.requests >= 150
    assert free == total
    assert ok.status_code == 200
