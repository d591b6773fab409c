"""Tool calling and structured outputs through the real server with the official `openai` client, on the tiny
random model: whatever a model's weights would say, a forced call is a call to a given tool with arguments valid
against its schema, streamed in OpenAI's delta shape; a response format, a choice and a regex hold likewise.
(Each schema here is finite — enums, booleans, bounded integers — so a random model's answer always ends.)"""

import json
import re

import jsonschema
import pytest
from pydantic import BaseModel
from typing import Literal

CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "celsius": {"type": "boolean"}},
        "required": ["city", "celsius"]}
SCORE = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 99}},
         "required": ["score"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": CITY}},
         {"type": "function", "function": {"name": "rate", "parameters": SCORE}}]
SCHEMAS = {"get_weather": CITY, "rate": SCORE}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    """The tiny model with a longer context: its tokenizer spends about a token per character, and the tool listing
    the default presentation writes into the prompt is ~900 characters."""
    from server_helpers import serve_tiny_model

    with serve_tiny_model(context=2048, num_blocks=512) as running:
        yield running


def model(client) -> str:
    return client.models.list().data[0].id


def assert_valid_call(call) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tool_choice_required_answers_with_a_valid_call(client):
    response = client.chat.completions.create(model=model(client), messages=ASK, tools=TOOLS, tool_choice="required",
                                              parallel_tool_calls=False, max_tokens=200, temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    assert_valid_call(choice.message.tool_calls[0])


def test_parallel_calls_are_each_valid(client):
    response = client.chat.completions.create(model=model(client), messages=ASK, tools=TOOLS, tool_choice="required",
                                              max_tokens=300, temperature=1.0, seed=3, n=3)
    for choice in response.choices:
        assert choice.message.tool_calls, choice.message.content
        for call in choice.message.tool_calls:
            assert_valid_call(call)
        assert choice.finish_reason in ("tool_calls", "length")


def test_a_named_call_streams_in_openais_delta_shape_and_equals_the_whole_answer(client):
    named = {"type": "function", "function": {"name": "rate"}}
    whole = client.chat.completions.create(model=model(client), messages=ASK, tools=TOOLS, tool_choice=named,
                                           max_tokens=200, temperature=0).choices[0]
    assert whole.finish_reason == "tool_calls" and [c.function.name for c in whole.message.tool_calls] == ["rate"]
    assert_valid_call(whole.message.tool_calls[0])

    chunks = list(client.chat.completions.create(model=model(client), messages=ASK, tools=TOOLS, tool_choice=named,
                                                 max_tokens=200, temperature=0, stream=True))
    deltas = [d for chunk in chunks if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
    first, rest = deltas[0], deltas[1:]
    assert (first.index, first.type, first.function.name) == (0, "function", "rate") and first.id.startswith("call_")
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    assert "".join(d.function.arguments or "" for d in deltas) == whole.message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)


def test_a_history_of_calls_and_results_is_accepted(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Oslo", "celsius": true}'}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"}]
    response = client.chat.completions.create(model=model(client), messages=history, tools=TOOLS, max_tokens=4)
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_none_answers_in_text(client):
    response = client.chat.completions.create(model=model(client), messages=ASK, tools=TOOLS, tool_choice="none",
                                              max_tokens=8, temperature=0)
    assert response.choices[0].message.tool_calls in (None, [])


class Forecast(BaseModel):
    city: Literal["Paris", "Oslo"]
    rain: bool
    days: Literal[1, 2, 3]


def test_parse_with_a_pydantic_model_gives_that_model(client):
    response = client.chat.completions.parse(model=model(client), messages=ASK, response_format=Forecast,
                                             max_tokens=200, temperature=0.8, seed=1)
    assert isinstance(response.choices[0].message.parsed, Forecast)


@pytest.mark.parametrize("extra", [{"structured_outputs": {"choice": ["yes", "no"]}}, {"guided_choice": ["yes", "no"]}])
def test_a_choice_is_one_of_its_options(client, extra):
    for seed in range(3):
        text = client.completions.create(model=model(client), prompt="Is it raining?", max_tokens=8, seed=seed,
                                         extra_body=extra).choices[0].text
        assert text in ("yes", "no")


def test_a_regex_is_matched_whole(client):
    for seed in range(3):
        text = client.completions.create(model=model(client), prompt="A code:", max_tokens=16, seed=seed,
                                         extra_body={"structured_outputs": {"regex": r"[A-F]{2}-\d{3}"}}).choices[0].text
        assert re.fullmatch(r"[A-F]{2}-\d{3}", text)


def test_a_json_schema_holds_on_completions_too(client):
    text = client.completions.create(model=model(client), prompt="{", max_tokens=200, temperature=0,
                                     extra_body={"guided_json": json.dumps(CITY)}).choices[0].text
    jsonschema.validate(json.loads(text), CITY)
    assert set(json.loads(text)) == {"city", "celsius"}  # objects are closed: no property the schema did not list


def test_metrics_count_constrained_requests_compiles_cache_hits_and_masks(server, client):
    import httpx

    def scrape() -> dict[str, float]:
        text = httpx.get(f"{server.url}/metrics").text
        return {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
                if line.startswith(("ridgeline_structured", "ridgeline_grammar"))}

    before = scrape()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    for _ in range(2):  # the second finds the first's grammar compiled
        client.completions.create(model=model(client), prompt="x", max_tokens=20, temperature=0,
                                  extra_body={"guided_json": schema})
    after = scrape()
    assert after["ridgeline_structured_requests"] - before["ridgeline_structured_requests"] == 2
    assert after["ridgeline_grammar_compiled"] - before["ridgeline_grammar_compiled"] == 1
    assert after["ridgeline_grammar_cache_hits"] - before["ridgeline_grammar_cache_hits"] >= 1
    # Greedy rows check their argmax and compute a mask only where the grammar refuses it (a random model's argmax
    # is refused at the schema's fixed keys): those masks are counted at sampling, the worker's apart.
    masks = ("ridgeline_grammar_masks", "ridgeline_grammar_masks_at_sampling")
    assert sum(after[name] for name in masks) > sum(before[name] for name in masks)
    assert after["ridgeline_grammar_masks_at_sampling"] > before["ridgeline_grammar_masks_at_sampling"]
    assert after["ridgeline_grammar_compile_seconds"] > 0


def test_tokenize_counts_a_chat_prompt_with_its_tools_as_the_chat_endpoint_does(server, client):
    """/tokenize (and the P/D front's /v1/kv/lookup, which asks it) renders the tools into the prompt as a chat
    completion does; else a front sizes a prompt without them and sends the decode worker more than it can hold."""
    import httpx

    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required"}
    with_tools = httpx.post(f"{server.url}/tokenize", json=body).json()["count"]
    without = httpx.post(f"{server.url}/tokenize", json={"messages": ASK}).json()["count"]
    usage = client.chat.completions.create(model=model(client), messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=1).usage
    assert with_tools == usage.prompt_tokens > without
