"""Shared by tests that compare against llama.cpp's recorded outputs (the default model's, SmolLM2's)."""

import json
from pathlib import Path

import torch

REFERENCE_DIR = Path(__file__).resolve().parent / "data" / "reference"  # copied in: a clone tests itself


def load_reference(name: str = "llamacpp_gemma3_270m_q4km.json") -> dict:
    return json.loads((REFERENCE_DIR / name).read_text())


def teacher_forced_logits(runner, ids: list[int]) -> torch.Tensor:
    """Logits at every position of `ids` in one pass over a fresh sequence."""
    from ridgeline.model.attention_batch import ForwardChunk

    blocks = -(-len(ids) // runner.kv_cache.block_size)
    return runner.run([ForwardChunk(ids, 0, runner.kv_cache.group_tables(list(range(blocks))), all_logits=True)])[0]
