"""Tiny random llama / qwen2 / gemma3 / qwen3 / qwen3moe / gpt-oss models give the same logits as Hugging Face
transformers (fp32, 1e-4 relative), whether loaded from safetensors or from a GGUF the test writes; and chunking or
batching does not change them (for the MoE models: expert routing in ragged batches of decode rows and prefill
chunks; for gpt-oss also its attention sinks, alternating 8-token sliding window and YaRN RoPE)."""

import pytest
import torch
from tiny_models import ARCHITECTURES, build_hf_model, write_gguf

from ridgeline.engine.assemble import assemble_model
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.model_runner import ModelRunner
from ridgeline.model.attention_batch import ForwardChunk

PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 300, 11, 64, 128, 1, 2, 77, 380, 19, 23, 200, 8]  # > the windows of 8


@pytest.fixture(scope="module", params=ARCHITECTURES)
def tiny(request, tmp_path_factory):
    arch = request.param
    directory = tmp_path_factory.mktemp(arch)
    hf_model = build_hf_model(arch, directory)
    write_gguf(hf_model, arch, directory / "model.gguf")
    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT])).logits[0]
    return arch, directory, expected


def runner_for(path) -> ModelRunner:
    return assemble_model(path, cache=KVCacheConfig(block_size=4, dtype="fp32"), num_blocks=32).runner


def assert_close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_logits_match_transformers(tiny, source):
    arch, directory, expected = tiny
    runner = runner_for(directory if source == "safetensors" else directory / "model.gguf")
    assert runner.model.config.architecture == arch
    logits = runner.run([ForwardChunk(PROMPT, 0, runner.kv_cache.group_tables(list(range(5))), all_logits=True)])[0]
    assert_close(logits, expected)


def test_chunked_prefill_and_decode_rows_match_one_pass(tiny):
    _, directory, expected = tiny
    runner = runner_for(directory / "model.gguf")
    blocks = runner.kv_cache.group_tables(list(range(5)))
    first = runner.run([ForwardChunk(PROMPT[:7], 0, blocks, all_logits=True)])[0]
    second = runner.run([ForwardChunk(PROMPT[7:15], 7, blocks, all_logits=True)])[0]
    decodes = [runner.run([ForwardChunk([PROMPT[i]], i, blocks)])[0] for i in range(15, len(PROMPT))]
    assert_close(torch.cat([first, second, *decodes]), expected)


def test_ragged_batch_matches_each_sequence_alone(tiny):
    _, directory, expected = tiny
    runner = runner_for(directory / "model.gguf")
    # sequence A is mid-decode (prefilled first), B prefills in the same step as A's decode row
    tables = runner.kv_cache.group_tables
    runner.run([ForwardChunk(PROMPT[:12], 0, tables([0, 1, 2]))])
    other = PROMPT[::-1][:9]
    decode_row, prefill = runner.run([ForwardChunk([PROMPT[12]], 12, tables([0, 1, 2, 3])),
                                      ForwardChunk(other, 0, tables([4, 5, 6]), all_logits=True)])
    assert_close(decode_row[0], expected[12])
    alone = runner_for(directory / "model.gguf").run([ForwardChunk(other, 0, tables([0, 1, 2]), all_logits=True)])[0]
    assert_close(prefill, alone)
