"""What one forward pass computes: chunks of tokens from several sequences, and where their keys live in the paged cache.

The engine describes a step as a list of `ForwardChunk`s (a decode is a 1-token chunk; prefill chunks are longer).
`AttentionBatch.build` turns that into flat token rows, each with its sequence and the range of key positions
it attends: [window start, own position] (causal, and inside the sliding window if its layer has one). Per
layer group (model/kv_groups.py) it holds the block tables and the cache slots where the new tokens' K and V go.
It is built once per step and shared by all layers; the attention kernel reads keys straight from the pages.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from ridgeline.model.row_paths import RowPaths


@dataclass
class ForwardChunk:
    """What the model computes for one sequence in one forward pass: token ids, positions and pages, no engine
    objects. The engine builds one from each of the scheduler's ScheduledChunks (which also carry the Sequence)."""

    token_ids: list[int]  # tokens to compute this step
    start: int  # position of token_ids[0] in its sequence
    # Per layer group, the page of each block of positions [0, start + len(token_ids)); a sliding-window group
    # may hold -1 for a block wholly before the window of this chunk's first token (released, never read).
    block_tables: Sequence[Sequence[int]]
    all_logits: bool = False  # logits for every token (perplexity, prompt logprobs) instead of just the last
    # Positions before this are prompt tokens, the rest were generated (None: all are prompt tokens).
    # It picks each row's matmul path (see RowPaths), so it must not depend on how the request was batched.
    num_prompt_tokens: int | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass
class GroupView:
    """One layer group's part of the step."""

    block_tables: torch.Tensor  # [chunks, blocks] int32 pages, -1 where released or past a chunk's end
    slot_mapping: torch.Tensor  # [T] int64: the slot each token's K and V are written to
    key_begin: torch.Tensor  # [T] int32: the first key position each row attends


@dataclass
class AttentionBatch:
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    row_seq: torch.Tensor  # [T] int32: each row's chunk
    key_end: torch.Tensor  # [T] int32: one past the last key position each row attends (its own position)
    block_size: int
    row_starts: list[int]  # chunk i's rows are [row_starts[i], row_starts[i + 1])
    groups: list[GroupView]  # per layer group
    logit_rows: torch.Tensor  # rows whose logits are wanted, in chunk order
    logit_counts: list[int]  # how many logit rows each chunk gets
    row_paths: RowPaths  # which rows take the memory-bound and which the compute-bound matmul path

    @staticmethod
    def build(chunks: list[ForwardChunk], block_size: int, group_windows: list[int | None],
              device: torch.device) -> "AttentionBatch":
        # Built with numpy, then wrapped as tensors without a copy: a torch op on a few ints costs several
        # microseconds of dispatch, a numpy op one, and a decode step of Gemma 3 (six layer groups) built with torch
        # ops spent ~0.6 ms here, as long as a decode step's sampling and scheduling together.
        lengths = np.fromiter((len(c.token_ids) for c in chunks), np.int64, len(chunks))
        row_starts = [0, *accumulate(lengths.tolist())]
        num_rows = row_starts[-1]
        row_seq = np.repeat(np.arange(len(chunks)), lengths)
        first_rows = np.asarray(row_starts[:-1], np.int64)
        starts = np.fromiter((c.start for c in chunks), np.int64, len(chunks))
        positions = np.arange(num_rows) + (starts - first_rows)[row_seq]
        prompt_ends = np.fromiter((c.end if c.num_prompt_tokens is None else c.num_prompt_tokens for c in chunks),
                                  np.int64, len(chunks))
        is_prompt = positions < prompt_ends[row_seq]
        logit_rows = [r for c, start, end in zip(chunks, row_starts, row_starts[1:])
                      for r in (range(start, end) if c.all_logits else [end - 1])]
        tables, slots = _group_tables_and_slots(chunks, len(group_windows), positions, row_seq, block_size)
        key_begins: dict[int | None, torch.Tensor] = {}
        groups = []
        for index, window in enumerate(group_windows):
            if window not in key_begins:
                key_begin = np.maximum(positions - window + 1, 0) if window else np.zeros_like(positions)
                key_begins[window] = _tensor(key_begin.astype(np.int32), device)
            groups.append(GroupView(_tensor(tables[index], device), _tensor(slots[index], device), key_begins[window]))
        token_ids = np.fromiter((t for c in chunks for t in c.token_ids), np.int64, num_rows)
        return AttentionBatch(
            token_ids=_tensor(token_ids, device),
            positions=_tensor(positions, device),
            row_seq=_tensor(row_seq.astype(np.int32), device),
            key_end=_tensor((positions + 1).astype(np.int32), device),
            block_size=block_size,
            row_starts=row_starts,
            groups=groups,
            logit_rows=_tensor(np.asarray(logit_rows, np.int64), device),
            logit_counts=[len(c.token_ids) if c.all_logits else 1 for c in chunks],
            row_paths=_row_paths(is_prompt, device),
        )


def _group_tables_and_slots(chunks: list[ForwardChunk], num_groups: int, positions: np.ndarray, row_seq: np.ndarray,
                            block_size: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per layer group, the chunks' block tables padded with -1 to one width ([chunks, blocks] int32), and each
    row's KV slot ([T] int64). The engine's groups all have tables of one length, so one array covers them all."""
    blocks, offsets = np.divmod(positions, block_size)
    rows = [[c.block_tables[g] for c in chunks] for g in range(num_groups)]
    widths = {len(row) for group in rows for row in group}
    if len(widths) == 1:  # no padding: one conversion and one gather for every group
        tables = np.array(rows, np.int32).reshape(num_groups, len(chunks), widths.pop())
        # (The gather lays its result out row-major in the row index: made contiguous per group, as kernels expect.)
        slots = np.ascontiguousarray(tables[:, row_seq, blocks].astype(np.int64) * block_size + offsets)
        return list(tables), list(slots)
    tables, slots = [], []
    for group in rows:
        width = max(map(len, group))
        table = np.array([[*row, *[-1] * (width - len(row))] for row in group], np.int32).reshape(len(group), width)
        tables.append(table)
        slots.append(table[row_seq, blocks].astype(np.int64) * block_size + offsets)
    return tables, slots


def _row_paths(is_prompt: np.ndarray, device: torch.device) -> RowPaths:
    # Counted in numpy: a torch sum of a few bools costs tens of microseconds in a decode step.
    num_prompt = int(np.count_nonzero(is_prompt))
    if num_prompt in (0, len(is_prompt)):
        return RowPaths(len(is_prompt), None, None, num_prompt > 0)  # what from_prompt_mask gives, uncounted
    return RowPaths.from_prompt_mask(_tensor(is_prompt, device))


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """The array as a tensor on `device` (on the CPU, the same memory)."""
    tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device)
