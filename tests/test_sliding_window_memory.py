"""Sliding-window layers keep only their window's KV: on a tiny random Gemma 3 (two sliding layers with a window of
8, one full-attention layer: three layer groups of one layer), a sequence far longer than the window holds every
block's page in the full-attention group but at most the window's pages in each sliding group, fits a pool too
small to hold it at full cost, and generates exactly the tokens it generates with a generous pool; several such
sequences in a pool that cannot hold them together are preempted and recomputed and still do."""

import math

import pytest
from tiny_models import build_hf_model, save_tokenizer

from ridgeline.engine.block_manager import RELEASED, peak_pages
from ridgeline.engine.kv_cache import KVCacheConfig, describe_capacity, page_bytes
from ridgeline.engine.llm import LLM
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.model.checkpoint import read_checkpoint

BLOCK_SIZE = 4
WINDOW = 8  # tiny_models' Gemma 3 sliding window
CHUNK = 16
GREEDY = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * k) % 380 + 2 for i in range(n)] for k, n in enumerate((120, 90, 105))]


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("gemma3")
    build_hf_model("gemma3", directory)
    save_tokenizer(directory)
    return str(directory)


def engine_config(model: str, num_pages: int | None = None) -> EngineConfig:
    cache = KVCacheConfig(block_size=BLOCK_SIZE, dtype="fp32")
    if num_pages is not None:  # a pool of exactly num_pages pages
        cache = KVCacheConfig(BLOCK_SIZE, "fp32", num_pages * page_bytes(read_checkpoint(model).config, cache))
    return EngineConfig(model=model, kv_cache=cache,
                        scheduler=SchedulerConfig(max_num_batched_tokens=CHUNK))


@pytest.fixture(scope="module")
def generous(tiny_gemma3) -> list[list[int]]:
    llm = LLM(config=engine_config(tiny_gemma3))
    return [out.output_token_ids for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_a_long_sequence_holds_only_the_window_in_sliding_groups(tiny_gemma3, generous):
    prompt = PROMPTS[0]
    length = len(prompt) + GREEDY.max_tokens
    windows = (None, WINDOW, WINDOW)
    # Just the pages one such sequence ever needs; at full cost (a page in each of the 3 groups for every block)
    # they would hold a third as many blocks.
    num_pages = peak_pages(length, CHUNK, windows, BLOCK_SIZE)
    engine = LLMEngine(engine_config(tiny_gemma3, num_pages))
    assert [group.window for group in engine.runner.kv_cache.groups] == list(windows)
    assert engine.scheduler.max_seq_len >= length > num_pages // 3 * BLOCK_SIZE
    engine.add_request("long", prompt, GREEDY)
    (seq,) = engine.scheduler.waiting
    tokens, most_sliding = [], 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens = out.output_token_ids
        if seq.block_tables:
            full, *sliding = ([page for page in table if page != RELEASED] for table in seq.block_tables)
            assert len(full) == math.ceil(seq.num_computed_tokens / BLOCK_SIZE)
            # The next query reads the 7 keys before it: 2 or 3 blocks, never a block wholly below the window.
            for pages, table in zip(sliding, seq.block_tables[1:]):
                assert len(pages) <= math.ceil((WINDOW - 1) / BLOCK_SIZE) + 1
                released = max(0, seq.num_computed_tokens - WINDOW + 1) // BLOCK_SIZE
                assert table[:released] == [RELEASED] * released
                most_sliding = max(most_sliding, len(pages))
            assert engine.stats().num_total_pages - engine.stats().num_free_pages == len(full) + sum(map(len, sliding))
    assert most_sliding == 3
    assert tokens == generous[0]
    assert engine.stats().num_free_pages == num_pages


def test_sequences_preempted_in_a_small_pool_generate_what_they_do_in_a_generous_one(tiny_gemma3, generous):
    num_pages = peak_pages(len(PROMPTS[0]) + GREEDY.max_tokens, CHUNK, (None, WINDOW, WINDOW), BLOCK_SIZE) + 8
    llm = LLM(config=engine_config(tiny_gemma3, num_pages))
    assert [out.output_token_ids for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == generous
    assert llm.engine.stats().num_preemptions > 0
    assert llm.engine.stats().num_free_pages == num_pages


def test_capacity_report_counts_window_limited_pages(tiny_gemma3):
    engine = LLMEngine(engine_config(tiny_gemma3, num_pages=300))
    report = engine.capacity_report
    # 2 K/V x 2 kv_heads x 32 head_dim x 3 layers x 4 B = 1,536 B a token in every layer; 512 B past the window.
    assert "300 pages x 4 tokens x 1 layers = 400 tokens of all layers (1,536 B/token in fp32" in report
    assert "past the 8-token sliding window a token costs 512 B (only the 1 full-attention layers keep it)" in report
    # 2,048 tokens: 512 pages in the full-attention group; in each sliding group the blocks of keys 2,041..2,047.
    assert "0 sequences of 2,048 tokens (516 pages each)" in report
    cache = KVCacheConfig(BLOCK_SIZE, "fp32")
    assert "2 sequences of 64 tokens (20 pages each)" in describe_capacity(engine.model_config, cache, 50, CHUNK, seq_len=64)
    assert report.endswith("one sequence up to 256 tokens (the model's context)")
    # A prefill chunk of 16 tokens holds up to 7 pages in each sliding group (the 7 keys before it, its 16, and
    # block boundaries), so 52 pages leave 38 blocks of 4 tokens for the full-attention group.
    assert describe_capacity(engine.model_config, cache, 52, CHUNK).endswith("one sequence up to 152 tokens")
