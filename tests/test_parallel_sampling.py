"""n > 1 prefills the prompt once: the other samples fork the first and share its prompt pages, and each sample is
exactly what the same seed gives run alone (the forked samples compute only the prompt's last block again)."""

import httpx
import openai
import pytest

from server_helpers import serve_tiny_model, tiny_engine

from ridgeline.engine.llm import LLM
from ridgeline.engine.sampling_params import SamplingParams

PROMPT_LEN = 488  # the tiny model's context is 512
BLOCK = 16


def offline(engine) -> LLM:
    llm = LLM.__new__(LLM)  # the tiny engine is built by the test helpers; LLM only wraps it
    llm.engine, llm.tokenizer = engine, engine.tokenizer
    llm._ids = iter(range(10**9))
    return llm


def prompt_ids(length: int = PROMPT_LEN) -> list[int]:
    return [(7 * i) % 300 + 5 for i in range(length)]


def assert_prefilled_once_and_samples_equal_alone(llm: LLM, fresh_llm, prompt: list[int]) -> list:
    params = SamplingParams(n=4, temperature=0.8, top_p=0.95, seed=1234, max_tokens=8, ignore_eos=True)
    together = llm.generate([prompt], params, use_tqdm=False)
    prefilled = llm.engine.stats().num_prefilled_tokens
    # One full prefill, then each fork recomputes only the prompt's last block (partial or not).
    assert prefilled == len(prompt) + 3 * (len(prompt) - (len(prompt) - 1) // BLOCK * BLOCK)
    assert prefilled < 1.1 * len(prompt)
    for index, out in enumerate(together):
        alone = fresh_llm().generate([prompt], params.child(index), use_tqdm=False)
        assert out.output_token_ids == alone[0].output_token_ids
    assert llm.engine.stats().num_free_pages == llm.engine.num_pages
    return together


def test_n4_prefills_the_prompt_once_and_each_sample_equals_its_seed_alone() -> None:
    together = assert_prefilled_once_and_samples_equal_alone(offline(tiny_engine(num_blocks=512)),
                                                             lambda: offline(tiny_engine(num_blocks=512)), prompt_ids())
    assert len({tuple(out.output_token_ids) for out in together}) > 1, "distinct seeds should differ somewhere"


@pytest.mark.slow
def test_n4_on_a_1000_token_prompt_of_the_default_model() -> None:
    from ridgeline.engine.llm_engine import EngineConfig
    from ridgeline.engine.scheduler import SchedulerConfig

    llm = LLM()
    text = "The KV cache grows with every token, and the n samples of one prompt share its pages. " * 60
    prompt = llm.tokenizer.encode(text)[:1000]
    assert len(prompt) == 1000
    # "Alone" without prefix caching: nothing of the first run can leak into the comparison.
    alone = LLM(config=EngineConfig(scheduler=SchedulerConfig(enable_prefix_caching=False)))
    alone._ids = iter(range(10**9))
    assert_prefilled_once_and_samples_equal_alone(llm, lambda: alone, prompt)


def test_n_choices_through_the_server_prefill_the_prompt_once() -> None:
    with serve_tiny_model(num_blocks=512) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        response = client.completions.create(model=client.models.list().data[0].id, prompt=prompt_ids(), n=3,
                                             max_tokens=5, temperature=1.0, seed=7, extra_body={"ignore_eos": True})
        assert sorted(choice.index for choice in response.choices) == [0, 1, 2]
        assert response.usage.prompt_tokens == PROMPT_LEN
        metrics = httpx.get(f"{server.url}/metrics").text
        prefilled = next(float(line.split()[-1]) for line in metrics.splitlines()
                         if line.startswith("ridgeline_prefilled_tokens{"))
        assert prefilled < 1.1 * PROMPT_LEN
