"""On the real default model, the server's greedy output equals offline `LLM.generate` for the same prompts,
whether the requests arrive one by one, batched in one request, or as concurrent streams."""

import asyncio

import openai
import pytest

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm import LLM
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.launcher import BackgroundServer

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
CHAT = [{"role": "user", "content": "Name three primary colours."}]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def offline_and_server():
    llm = LLM(config=EngineConfig(kv_cache=KVCacheConfig(memory_bytes=64 << 20)))
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    tokenizer = llm.tokenizer
    chat_ids = tokenizer.encode(tokenizer.apply_chat_template(CHAT), special=True)
    offline = [o.text for o in llm.generate(PROMPTS + [chat_ids], greedy, use_tqdm=False)]
    with BackgroundServer(create_app(llm.engine, ServerConfig(served_model_name="gemma"))) as server:  # same engine
        yield offline, server


def test_completions_equal_offline_generate(offline_and_server):
    offline, server = offline_and_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    one_by_one = [client.completions.create(model="gemma", prompt=p, max_tokens=MAX_TOKENS,
                                            temperature=0).choices[0].text for p in PROMPTS]
    assert one_by_one == offline[: len(PROMPTS)]
    batched = client.completions.create(model="gemma", prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0)
    assert [c.text for c in sorted(batched.choices, key=lambda c: c.index)] == offline[: len(PROMPTS)]


def test_chat_equals_offline_generate_on_the_templated_prompt(offline_and_server):
    offline, server = offline_and_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    response = client.chat.completions.create(model="gemma", messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
    assert response.choices[0].message.content == offline[-1]


def test_concurrent_streams_equal_offline_generate(offline_and_server):
    offline, server = offline_and_server

    async def stream_all() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

        async def one(prompt: str) -> str:
            chunks = await client.completions.create(model="gemma", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                     stream=True)
            return "".join([chunk.choices[0].text async for chunk in chunks])

        try:
            return await asyncio.gather(*(one(p) for p in PROMPTS))
        finally:
            await client.close()

    assert asyncio.run(stream_all()) == offline[: len(PROMPTS)]
