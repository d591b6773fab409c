"""In a running engine, every step's AttentionBatch from the runner's reused buffers (engine/step_batch.py) equals a
fresh AttentionBatch.build of the same chunks, through what changes a sequence's tables or a step's shape under the
builder's feet: preemption under a tiny KV budget (pages freed, the sequence recomputed into others), aborts and
finishes (rows leaving), late arrivals (rows joining), and speculative decoding (decodes of several rows)."""

import pytest
from attention_batch_helpers import assert_same

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.engine.speculative import SpeculativeConfig
from ridgeline.model.attention_batch import AttentionBatch

pytestmark = pytest.mark.slow


def checked_engine(config: EngineConfig) -> tuple[LLMEngine, list[int]]:
    """An engine whose runner checks each batch it builds against build; the list counts the checked steps."""
    llm = LLMEngine(config)
    runner, checked = llm.runner, []
    reused = runner.batches.build

    def build(chunks):
        batch = reused(chunks)
        assert_same(batch, AttentionBatch.build(chunks, runner.kv_cache.block_size, runner.model.group_windows,
                                                runner.model.options.device))
        checked.append(len(chunks))
        return batch

    runner.batches.build = build
    return llm, checked


def test_reused_batches_equal_fresh_ones_through_preemption_aborts_and_arrivals():
    # 12 blocks at full cost (72 pages of 6 layer groups): six sequences of up to 6 blocks run the pool dry
    llm, checked = checked_engine(EngineConfig(kv_cache=KVCacheConfig(memory_bytes=12 * 16 * 18_432),
                                               scheduler=SchedulerConfig(enable_prefix_caching=False)))
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(6):
        llm.add_request(f"r{i}", [2] + [100 + 7 * i + j for j in range(5 + 9 * i)], params)
    step = 0
    while llm.has_unfinished():
        llm.step()
        step += 1
        if step == 12:
            llm.abort("r2")
        if step == 20:
            llm.add_request("late", [2, 5, 6, 7], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert llm.stats().num_preemptions > 0
    assert len(checked) == step and max(checked) > 1


def test_reused_batches_equal_fresh_ones_with_speculative_decoding():
    llm, checked = checked_engine(EngineConfig(speculative=SpeculativeConfig(num_tokens=3)))
    repetitive = [2] + [651, 1131, 236761, 107] * 12  # n-gram guesses find matches in a repeating prompt
    llm.add_request("spec", repetitive, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    llm.add_request("plain", [2, 9, 8, 7], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    while llm.has_unfinished():
        llm.step()
    assert llm.stats().num_draft_tokens > 0 and checked
