"""Continuous batching changes nothing about what a request gets: greedy outputs of 15 mixed-length prompts
(three longer than the 512-token sliding window) are identical run alone, run as one batch, run with chunked
prefill under a 64-token budget or under an ITL target (chunks sized by measured step times), run again with every
full prompt block a prefix-cache hit, and run under a KV budget so small that requests get preempted and recomputed.

Every pass here is prefill compute (the default model on CPU), so the prompt set is as small as the properties
allow: a dozen short lengths spread over the first window, and three beyond it."""

import pytest
from reference_helpers import REFERENCE_DIR

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm import LLM
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import ItlTarget, SchedulerConfig

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
BLOCK_TOKENS = 16


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from ridgeline.model.checkpoint import read_checkpoint

    text = (REFERENCE_DIR / "gpl-3.0.txt").read_text()
    ids = read_checkpoint().load_tokenizer().encode(text, add_bos=False)
    lengths = [7 + 29 * i for i in range(12)] + [530, 620, 700]  # three beyond the sliding window
    return [[2] + ids[97 * i: 97 * i + n] for i, n in enumerate(lengths)]


def run_batch(llm: LLM, prompts) -> list[list[int]]:
    return [out.output_token_ids for out in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def alone(prompts) -> list[list[int]]:
    llm = LLM(config=EngineConfig(scheduler=SchedulerConfig(enable_prefix_caching=False)))
    return [run_batch(llm, [prompt])[0] for prompt in prompts]


def test_one_batch_equals_alone(prompts, alone):
    llm = LLM(config=EngineConfig(scheduler=SchedulerConfig(enable_prefix_caching=False)))
    assert run_batch(llm, prompts) == alone


def test_chunked_prefill_under_small_budget_equals_alone(prompts, alone):
    llm = LLM(config=EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=64, enable_prefix_caching=False)))
    assert run_batch(llm, prompts) == alone


def test_prefill_cut_to_an_itl_target_equals_alone(prompts, alone):
    # A tight target: beside decodes, prompts advance a page or a few a step, at boundaries the timing decides.
    llm = LLM(config=EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=512, enable_prefix_caching=False,
                                                            itl_target=ItlTarget(decode_multiple=1.5))))
    assert run_batch(llm, prompts) == alone
    limited = [step for step in llm.engine.steps.recent() if step.prefill_limit is not None]
    assert limited and all(step.prefill_tokens <= step.prefill_limit for step in limited)
    assert any(step.itl_target_s is not None for step in limited)  # the estimate took over from the first page
    # Its estimate prices a decode row, until decode steps of a full batch say otherwise, by the model's FLOPs.
    assert llm.engine.step_cost.decode_row_ratio == llm.engine.steps.shape.decode_row_flops_ratio() > 2


def test_prefix_cache_second_pass_all_hits_equals_alone(prompts, alone):
    llm = LLM(config=EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=256)))
    assert run_batch(llm, prompts) == alone
    second = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [out.output_token_ids for out in second] == alone
    for prompt, out in zip(prompts, second):
        # every full block of the prompt is a hit, except that the last prompt token is always computed
        assert out.num_cached_tokens == (len(prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def test_preemption_under_tiny_kv_budget_equals_alone(prompts, alone):
    # 46 blocks of the default model's bf16 KV at full cost (18,432 bytes a token in 18 layers): 276 pages of 3
    # layers, room for one sequence of 736 tokens (the longest prompt and its answer: 707), for 15 prompts of ~3,900
    # tokens. Which requests run together depends on token counts alone, not on the model's numbers, so whether
    # one is preempted is fixed by the budget: with these prompts 46 blocks preempt one, 48 or more none.
    kv_bytes = 46 * BLOCK_TOKENS * 18_432
    llm = LLM(config=EngineConfig(kv_cache=KVCacheConfig(memory_bytes=kv_bytes),
                                  scheduler=SchedulerConfig(enable_prefix_caching=False)))
    assert llm.engine.num_pages == 46 * 6
    assert run_batch(llm, prompts) == alone
    assert llm.engine.stats().num_preemptions > 0
    assert llm.engine.stats().num_free_pages == llm.engine.num_pages


def test_prompt_logprobs_are_complete_even_when_the_prompt_is_cached(prompts):
    llm = LLM(config=EngineConfig())
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
    # 240 tokens, 14 full blocks a cache could hold: every prompt position costs a full-vocabulary (262,144) row of
    # logits, so a longer prompt adds seconds and nothing to check.
    prompt = prompts[8]
    assert len(prompt) == 240
    first, second = (llm.generate([prompt], params, use_tqdm=False)[0] for _ in range(2))
    assert len(first.prompt_logprobs) == len(second.prompt_logprobs) == len(prompt) - 1
    assert [p.token_id for p in second.prompt_logprobs] == prompt[1:]
    assert [p.logprob for p in first.prompt_logprobs] == [p.logprob for p in second.prompt_logprobs]
