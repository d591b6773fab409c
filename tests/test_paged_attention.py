"""The compiled paged-attention kernel: same results as plain torch attention, and a row's bits never depend on
the rest of the batch (batch invariance of the engine's outputs rests on it)."""

import pytest
import torch
from compiled_kernels import needs_compiled

from ridgeline.model.attention_batch import AttentionBatch, ForwardChunk
from ridgeline.model.layers.attention_kernel import paged_attention, paged_attention_reference

BLOCK = 4
PAGES = 64


def scattered_tables(lengths: list[int], generator: torch.Generator) -> list[list[int]]:
    """Each sequence's blocks on distinct pages in a shuffled order, so slots are not positions."""
    pages = torch.randperm(PAGES, generator=generator).tolist()
    tables = []
    for length in lengths:
        count = -(-length // BLOCK)
        tables.append(pages[:count])
        pages = pages[count:]
    return tables


def setup(heads, kv_heads, head_dim, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(PAGES * BLOCK, kv_heads, head_dim, generator=generator).to(dtype)
    v_cache = torch.randn(PAGES * BLOCK, kv_heads, head_dim, generator=generator).to(dtype)
    return generator, k_cache, v_cache


def batch_of(chunks: list[ForwardChunk], window: int | None) -> AttentionBatch:
    return AttentionBatch.build(chunks, BLOCK, [window], torch.device("cpu"))


@needs_compiled
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 1, 256), (8, 2, 64), (6, 2, 128), (16, 2, 64), (2, 2, 32)])
@pytest.mark.parametrize("window", [None, 5])
def test_kernel_matches_torch_attention(dtype, heads, kv_heads, head_dim, window):
    generator, k_cache, v_cache = setup(heads, kv_heads, head_dim, dtype)
    # a decode deep into its sequence, a prefill chunk from 0, a chunk continuing a prefill, a one-token prompt
    shapes = [(37, 1), (0, 11), (9, 14), (0, 1)]
    tables = scattered_tables([start + length for start, length in shapes], generator)
    chunks = [ForwardChunk([0] * length, start, [table]) for (start, length), table in zip(shapes, tables)]
    batch = batch_of(chunks, window)
    q = torch.randn(batch.positions.numel(), heads, head_dim, generator=generator)
    scale = head_dim**-0.5
    expected = paged_attention_reference(q, k_cache, v_cache, batch, batch.groups[0], scale)
    actual = paged_attention(q, k_cache, v_cache, batch, batch.groups[0], scale)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@needs_compiled
@pytest.mark.parametrize("window", [None, 6])
def test_a_rows_bits_do_not_depend_on_its_batch_or_chunk(window):
    """Each row of a batch equals, bit for bit, the same row computed alone as a one-token chunk."""
    heads, kv_heads, head_dim = 4, 1, 256
    generator, k_cache, v_cache = setup(heads, kv_heads, head_dim, torch.bfloat16, seed=1)
    shapes = [(0, 23), (40, 1), (5, 7)]
    tables = scattered_tables([start + length for start, length in shapes], generator)
    chunks = [ForwardChunk([0] * length, start, [table]) for (start, length), table in zip(shapes, tables)]
    batch = batch_of(chunks, window)
    q = torch.randn(batch.positions.numel(), heads, head_dim, generator=generator)
    together = paged_attention(q, k_cache, v_cache, batch, batch.groups[0], 0.0625)
    row = 0
    for (start, length), table in zip(shapes, tables):
        for position in range(start, start + length):
            alone_batch = batch_of([ForwardChunk([0], position, [table])], window)
            alone = paged_attention(q[row:row + 1], k_cache, v_cache, alone_batch, alone_batch.groups[0], 0.0625)
            assert torch.equal(alone[0], together[row]), f"row {row} (position {position}) changed bits"
            row += 1


@needs_compiled
def test_a_released_page_inside_the_key_range_is_an_error():
    generator, k_cache, v_cache = setup(4, 1, 64, torch.float32)
    batch = batch_of([ForwardChunk([0], 9, [[3, -1, 7]])], window=None)  # position 9 reads blocks 0..2; block 1 gone
    q = torch.randn(1, 4, 64, generator=generator)
    with pytest.raises(RuntimeError, match="block 1 of row 0 is not a page"):
        paged_attention(q, k_cache, v_cache, batch, batch.groups[0], 0.125)
    windowed = batch_of([ForwardChunk([0], 9, [[-1, -1, 7]])], window=2)  # keys 8..9 only: released blocks unread
    assert torch.isfinite(paged_attention(q, k_cache, v_cache, windowed, windowed.groups[0], 0.125)).all()


def naive_attention_with_sinks(q, k_cache, v_cache, batch, scale, sinks):
    """Row by row and head by head, straight from the definition: softmax(scores ++ [sink]) without the sink's
    weight, over exactly the row's keys (read through its block table)."""
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    out = torch.empty_like(q)
    group = batch.groups[0]
    for row in range(q.shape[0]):
        table = group.block_tables[batch.row_seq[row]].long()
        positions = torch.arange(int(group.key_begin[row]), int(batch.key_end[row]))
        slots = table[positions // BLOCK] * BLOCK + positions % BLOCK
        for head in range(heads):
            kv = head // (heads // kv_heads)
            keys, values = k_cache[slots, kv].float(), v_cache[slots, kv].float()
            scores = torch.cat([keys @ q[row, head] * scale, sinks[head:head + 1]])
            out[row, head] = scores.softmax(0)[:-1] @ values
    return out


def ragged_batch_with_sinks(heads, kv_heads, head_dim, dtype, window, seed=0):
    generator, k_cache, v_cache = setup(heads, kv_heads, head_dim, dtype, seed)
    shapes = [(37, 1), (0, 11), (9, 14), (0, 1)]  # decode deep in, prefill from 0, continued chunk, 1-token prompt
    tables = scattered_tables([start + length for start, length in shapes], generator)
    batch = batch_of([ForwardChunk([0] * length, start, [table]) for (start, length), table in zip(shapes, tables)], window)
    q = torch.randn(batch.positions.numel(), heads, head_dim, generator=generator)
    sinks = torch.randn(heads, generator=generator) * 2  # some above every score, some below
    return q, k_cache, v_cache, batch, sinks


@pytest.mark.parametrize("window", [None, 5])
def test_torch_path_with_sinks_matches_the_definition(window):
    q, k_cache, v_cache, batch, sinks = ragged_batch_with_sinks(8, 2, 32, torch.float32, window)
    expected = naive_attention_with_sinks(q, k_cache, v_cache, batch, 0.17, sinks)
    actual = paged_attention_reference(q, k_cache, v_cache, batch, batch.groups[0], 0.17, sinks)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    # the sink takes weight away from the values: the same rows without it differ
    plain = paged_attention_reference(q, k_cache, v_cache, batch, batch.groups[0], 0.17)
    assert not torch.allclose(plain, actual, atol=1e-3)


@needs_compiled
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 2, 64), (4, 1, 32), (16, 2, 64)])
@pytest.mark.parametrize("window", [None, 5])
def test_kernel_with_sinks_matches_torch(dtype, heads, kv_heads, head_dim, window):
    q, k_cache, v_cache, batch, sinks = ragged_batch_with_sinks(heads, kv_heads, head_dim, dtype, window)
    expected = paged_attention_reference(q, k_cache, v_cache, batch, batch.groups[0], head_dim**-0.5, sinks)
    actual = paged_attention(q, k_cache, v_cache, batch, batch.groups[0], head_dim**-0.5, sinks)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
