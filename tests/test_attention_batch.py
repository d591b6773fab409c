"""AttentionBatch.build (numpy, wrapped as tensors) gives exactly what the plain torch construction it replaced gave:
same values, dtypes and shapes for decodes, prefill chunks, mixed steps, all-logits chunks and several layer groups."""

import random

import pytest
import torch

from ridgeline.model.attention_batch import AttentionBatch, ForwardChunk
from ridgeline.model.row_paths import RowPaths

BLOCK = 4


def reference_build(chunks, block_size, group_windows):
    """The torch construction AttentionBatch.build used before it moved to numpy, field by field."""
    row_starts = [0]
    for c in chunks:
        row_starts.append(row_starts[-1] + len(c.token_ids))
    positions = torch.tensor([p for c in chunks for p in range(c.start, c.end)], dtype=torch.long)
    row_seq = torch.repeat_interleave(torch.arange(len(chunks)), torch.tensor([len(c.token_ids) for c in chunks]))
    is_prompt = torch.tensor([p < (c.end if c.num_prompt_tokens is None else c.num_prompt_tokens)
                              for c in chunks for p in range(c.start, c.end)], dtype=torch.bool)
    groups = []
    for index, window in enumerate(group_windows):
        width = max(len(c.block_tables[index]) for c in chunks)
        tables = torch.tensor([[*c.block_tables[index], *[-1] * (width - len(c.block_tables[index]))] for c in chunks],
                              dtype=torch.long)
        slots = tables[row_seq, positions // block_size] * block_size + positions % block_size
        key_begin = (positions - window + 1).clamp(min=0) if window else torch.zeros_like(positions)
        groups.append((tables.to(torch.int32), slots, key_begin.to(torch.int32)))
    logit_rows = [r for c, start, end in zip(chunks, row_starts, row_starts[1:])
                  for r in (range(start, end) if c.all_logits else [end - 1])]
    return {
        "token_ids": torch.tensor([t for c in chunks for t in c.token_ids], dtype=torch.long),
        "positions": positions,
        "row_seq": row_seq.to(torch.int32),
        "key_end": (positions + 1).to(torch.int32),
        "row_starts": row_starts,
        "groups": groups,
        "logit_rows": torch.tensor(logit_rows, dtype=torch.long),
        "logit_counts": [len(c.token_ids) if c.all_logits else 1 for c in chunks],
        "row_paths": RowPaths.from_prompt_mask(is_prompt),
    }


def random_chunk(rng, num_groups, windows, num_blocks=None):
    start = rng.randrange(0, 40)
    length = rng.choice([1, 1, 1, rng.randrange(1, 12)])
    if num_blocks is None:
        num_blocks = -(-(start + length) // BLOCK) + rng.randrange(0, 2)  # tables may run past the chunk's end
    else:  # tables of one width (the engine's case when its sequences hold equally many blocks)
        start, length = min(start, num_blocks * BLOCK - 1), 1
    tables = []
    for group in range(num_groups):
        table = [rng.randrange(0, 500) for _ in range(num_blocks)]
        if windows[group] is not None:  # released blocks below the window
            released = max(0, start - windows[group] + 1) // BLOCK
            table[:released] = [-1] * released
        tables.append(table)
    prompt = rng.choice([None, 0, start, start + length // 2, start + length + 3])
    return ForwardChunk([rng.randrange(0, 262_144) for _ in range(length)], start, tables,
                        all_logits=rng.random() < 0.3, num_prompt_tokens=prompt)


def assert_same(batch, expected):
    for name in ("token_ids", "positions", "row_seq", "key_end", "logit_rows"):
        got, want = getattr(batch, name), expected[name]
        assert got.dtype == want.dtype and torch.equal(got, want) and got.is_contiguous(), name
    assert batch.row_starts == expected["row_starts"]
    assert batch.logit_counts == expected["logit_counts"]
    for view, (tables, slots, key_begin) in zip(batch.groups, expected["groups"], strict=True):
        for got, want in ((view.block_tables, tables), (view.slot_mapping, slots), (view.key_begin, key_begin)):
            # Contiguous too: the compiled kernels take the data pointer and assume it.
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want) and got.is_contiguous()
    paths, want = batch.row_paths, expected["row_paths"]
    assert (paths.num_rows, paths.all_compute) == (want.num_rows, want.all_compute)
    for got, expected_rows in ((paths.compute_rows, want.compute_rows), (paths.memory_rows, want.memory_rows)):
        assert (got is None) == (expected_rows is None)
        if got is not None:
            assert torch.equal(got, expected_rows)


@pytest.mark.parametrize("windows", [[None], [8], [None, 8, 8, 8, 8, 8], [12, None]])
def test_build_equals_the_torch_construction(windows):
    rng = random.Random(len(windows))
    for trial in range(60):
        width = rng.choice([None, rng.randrange(1, 12)])
        chunks = [random_chunk(rng, len(windows), windows, width) for _ in range(rng.randrange(1, 9))]
        assert_same(AttentionBatch.build(chunks, BLOCK, windows, torch.device("cpu")),
                    reference_build(chunks, BLOCK, windows))


def test_decode_only_step_of_one_sequence():
    chunk = ForwardChunk([7], 9, [[3, 5, 11]], num_prompt_tokens=6)
    batch = AttentionBatch.build([chunk], BLOCK, [None], torch.device("cpu"))
    assert batch.positions.tolist() == [9] and batch.groups[0].slot_mapping.tolist() == [11 * BLOCK + 1]
    assert batch.row_paths.all_compute is False and batch.logit_rows.tolist() == [0]
