"""Issue 32: two requests for one prompt on one engine prefill it once. The second, arriving while the first is
still computing that prompt (or in the same step), waits for the blocks in flight and then finds them in the
prefix cache, so it computes at most its last block; its greedy tokens are those it gets alone.

On a tiny random Gemma 3 (a full-attention group and sliding groups of window 8) with a small token budget, so a
prompt's prefill spans several steps."""

import pytest
from tiny_models import build_hf_model, save_tokenizer

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig
from test_kv_transfer import run  # step until done: each request's final output tokens

BLOCK, BUDGET = 4, 16
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = [(11 * i) % 240 + 5 for i in range(61)]  # 4 steps of prefill at 16 tokens a step


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("gemma3")
    build_hf_model("gemma3", directory)
    save_tokenizer(directory)
    return str(directory)


def engine(model: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, kv_cache=KVCacheConfig(BLOCK, "fp32", 1 << 22),
                                  scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET)))


@pytest.fixture(scope="module")
def alone(model) -> list[int]:
    single = engine(model)
    single.add_request("alone", PROMPT, GREEDY)
    return run(single)["alone"]


@pytest.mark.parametrize("steps_apart", [0, 2])
def test_a_second_request_for_a_prompt_in_flight_prefills_only_its_last_block(model, alone, steps_apart):
    shared = engine(model)
    shared.add_request("first", PROMPT, GREEDY)
    finals = {}
    for _ in range(steps_apart):  # the first is half way through its prefill when the second arrives
        finals.update({out.request_id: out.output_token_ids for out in shared.step() if out.finished})
    assert shared.stats().num_prefilled_tokens == BUDGET * steps_apart < len(PROMPT)
    shared.add_request("second", PROMPT, GREEDY)
    shared.add_request("other", PROMPT[::-1], GREEDY)  # queued behind: waits its turn, then runs
    finals.update(run(shared))
    assert finals["first"] == finals["second"] == alone
    # The first and the other compute their prompts; the second only what follows the last whole block a hit can
    # have (a hit leaves the last token to compute): token 60.
    tail = len(PROMPT) - (len(PROMPT) - 1) // BLOCK * BLOCK
    assert tail == 1 and shared.stats().num_prefilled_tokens == 2 * len(PROMPT) + tail


def test_without_prefix_caching_both_prefill(model, alone):
    """The wait is for blocks the cache will hold: with caching off there is nothing to wait for."""
    config = EngineConfig(model=model, kv_cache=KVCacheConfig(BLOCK, "fp32", 1 << 22),
                          scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET, enable_prefix_caching=False))
    plain = LLMEngine(config)
    plain.add_request("first", PROMPT, GREEDY)
    plain.step()
    plain.add_request("second", PROMPT, GREEDY)
    finals = run(plain)
    assert finals["first"] == finals["second"] == alone
    assert plain.stats().num_prefilled_tokens == 2 * len(PROMPT)
