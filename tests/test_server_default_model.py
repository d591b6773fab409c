"""On the real default model, the server's greedy output equals offline `LLM.generate` for the same prompts,
streamed or not, one by one or batched in one request."""

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
    """Offline results for the same batch compositions the server will see: each prompt alone, and the three
    prompts together (the quantised kernels pick different paths by batch size, so a near-tie can differ)."""
    llm = LLM(config=EngineConfig(kv_cache=KVCacheConfig(memory_bytes=64 << 20)))
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    tokenizer = llm.tokenizer
    chat_ids = tokenizer.encode(tokenizer.apply_chat_template(CHAT), special=True)
    alone = [llm.generate([prompt], greedy, use_tqdm=False)[0].text for prompt in PROMPTS + [chat_ids]]
    together = [o.text for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    with BackgroundServer(create_app(llm.engine, ServerConfig(served_model_name="gemma"))) as server:  # same engine
        yield {"alone": alone, "together": together}, server


def test_completions_equal_offline_generate(offline_and_server):
    offline, server = offline_and_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    one_by_one = [client.completions.create(model="gemma", prompt=p, max_tokens=MAX_TOKENS, temperature=0).choices[0].text
                  for p in PROMPTS]
    assert one_by_one == offline["alone"][: len(PROMPTS)]
    batched = client.completions.create(model="gemma", prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0)
    assert [c.text for c in sorted(batched.choices, key=lambda c: c.index)] == offline["together"]


def test_streamed_completion_equals_offline_generate(offline_and_server):
    offline, server = offline_and_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    chunks = client.completions.create(model="gemma", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in chunks) == offline["alone"][0]


def test_chat_equals_offline_generate_on_the_templated_prompt(offline_and_server):
    offline, server = offline_and_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    response = client.chat.completions.create(model="gemma", messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
    assert response.choices[0].message.content == offline["alone"][-1]
