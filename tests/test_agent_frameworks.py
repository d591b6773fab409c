"""Agent frameworks against the real server, as their users wire them: pydantic-ai (an Agent with a typed output
and a function tool it calls, then answers from), the OpenAI Agents SDK (an agent with a @function_tool, through
its chat-completions model) and langchain-openai (with_structured_output and bind_tools). Each must complete
without an exception and every structured answer must validate.

On the tiny random model: what these tests check is the protocol — tools shown, calls made valid by grammar and
parsed by each framework, tool results sent back in the history and accepted, typed outputs parsed — not the
model's judgement. Seeded sampling makes a run repeatable; the schemas are finite so every answer ends.
(docs/structured_outputs.md has what the real default model does with the same agents.)"""

from typing import Literal

import pytest
from pydantic import BaseModel

pytest.importorskip("pydantic_ai")


class Weather(BaseModel):
    city: Literal["Paris", "Oslo", "Lima"]
    sunny: bool


@pytest.fixture(scope="module")
def server():
    from server_helpers import serve_tiny_model

    with serve_tiny_model(context=4096, num_blocks=1024) as running:
        yield running


@pytest.fixture(scope="module")
def model_name(client) -> str:
    return client.models.list().data[0].id


def test_pydantic_ai_agent_calls_its_tool_and_returns_its_typed_output(server, model_name):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    model = OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=f"{server.url}/v1", api_key="unused"))
    asked: list[str] = []
    for seed in range(4):  # a random model picks the tool or the answer at random: some runs make the round trip
        agent = Agent(model, output_type=Weather, model_settings={"temperature": 1.0, "seed": seed, "max_tokens": 300})

        @agent.tool_plain
        def is_sunny(city: Literal["Paris", "Oslo", "Lima"]) -> bool:
            """Whether it is sunny in a city now."""
            asked.append(city)
            return city != "Oslo"

        result = agent.run_sync("Is it sunny in Paris?", usage_limits=UsageLimits(request_limit=12))
        assert isinstance(result.output, Weather)
    assert asked, "no run called its tool and answered from its result"


def test_openai_agents_sdk_runs_a_function_tool(server, model_name):
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def is_sunny(city: Literal["Paris", "Oslo", "Lima"]) -> bool:
        """Whether it is sunny in a city now."""
        asked.append(city)
        return True

    model = OpenAIChatCompletionsModel(model=model_name,
                                       openai_client=AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused"))
    agent = Agent(name="weather", instructions="Answer with the tool's help.", tools=[is_sunny], model=model,
                  model_settings=ModelSettings(temperature=0, max_tokens=200, tool_choice="required"),
                  tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, "Is it sunny in Lima?")
    assert asked and asked[0] in ("Paris", "Oslo", "Lima")
    assert result.final_output == "True"


def test_langchain_structured_output_and_bound_tools(server, model_name):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=f"{server.url}/v1", api_key="unused", model=model_name, temperature=0, max_tokens=200)
    for method in ("function_calling", "json_schema"):
        assert isinstance(llm.with_structured_output(Weather, method=method).invoke("Weather?"), Weather)

    @tool
    def is_sunny(city: Literal["Paris", "Oslo", "Lima"]) -> bool:
        """Whether it is sunny in a city now."""
        return True

    message = llm.bind_tools([is_sunny], tool_choice="is_sunny").invoke("Is it sunny in Oslo?")
    (call,) = message.tool_calls
    assert call["name"] == "is_sunny" and call["args"]["city"] in ("Paris", "Oslo", "Lima")
