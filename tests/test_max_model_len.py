"""--max-model-len caps prompt + output as vLLM's does: a request without max_tokens stops there, one asking for
more is refused with context_length_exceeded, and /v1/models reports the cap."""

import openai
import pytest

from server_helpers import serve_tiny_model, tiny_engine

from ridgeline.errors import RidgelineError

CAP = 40


@pytest.fixture(scope="module")
def client():
    with serve_tiny_model(max_model_len=CAP) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_models_report_the_cap(client) -> None:
    assert client.models.list().data[0].model_extra["max_model_len"] == CAP


def test_a_request_without_max_tokens_stops_at_the_cap(client) -> None:
    response = client.completions.create(model=client.models.list().data[0].id, prompt="one two three", max_tokens=None,
                                         extra_body={"ignore_eos": True})
    assert response.choices[0].finish_reason == "length"
    assert response.usage.prompt_tokens + response.usage.completion_tokens == CAP


def test_asking_past_the_cap_is_refused(client) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=client.models.list().data[0].id, prompt="one two three", max_tokens=CAP)
    error = refused.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"


def test_a_cap_beyond_the_models_context_is_refused() -> None:
    with pytest.raises(RidgelineError, match="exceeds the model's context"):
        tiny_engine(max_model_len=10**6)
