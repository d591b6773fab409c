"""The AttentionBatch of a small step (steady decoding), written into buffers that live from step to step.

AttentionBatch.build makes some twenty small tensors a step. Right after a forward pass has streamed the weights
through the caches, every numpy or torch call on a handful of ints runs cold, several microseconds each: ~0.25 ms
of a batch-1 decode step of Gemma 3 (six layer groups). A decode step has the last one's shape (the same chunks,
one row each; tables a block wider every block_size steps), so here a small step's rows are computed in plain
Python and written with one numpy assignment per dtype into two buffers, whose tensor views, and the AttentionBatch
holding them, are made again only when the step's shape changes. Block tables are written only for the chunks
whose tables differ from what their rows hold.

The batch returned is overwritten by the next call: the model reads it during its forward pass and keeps nothing.
Bigger steps (prefill chunks), steps mixing prompt and generated rows, and devices other than the CPU get a fresh
AttentionBatch.build; both give the same values (tests/test_step_batch.py).
"""

import numpy as np
import torch

from ridgeline.model.attention_batch import AttentionBatch, ForwardChunk, GroupView
from ridgeline.model.row_paths import RowPaths

# Above this many rows, per-row Python costs more than build's per-call overhead (a prefill chunk, a large batch).
MAX_ROWS = 32


class StepBatchBuilder:
    def __init__(self, block_size: int, group_windows: list[int | None], device: torch.device):
        self.block_size = block_size
        self.group_windows = list(group_windows)
        self.windows = list(dict.fromkeys(group_windows))  # distinct windows: one key_begin row each
        self.device = device
        self._shape: tuple | None = None  # what the buffers and the batch below are laid out for
        self._int64 = self._int32 = self._tables = None
        self._written: list[tuple | None] = []
        self._batch: AttentionBatch | None = None

    def build(self, chunks: list[ForwardChunk]) -> AttentionBatch:
        num_rows = sum(len(c.token_ids) for c in chunks)
        if self.device.type != "cpu" or num_rows > MAX_ROWS:
            return AttentionBatch.build(chunks, self.block_size, self.group_windows, self.device)
        bs, num_groups = self.block_size, len(self.group_windows)
        token_ids, positions, row_seq, logit_rows = [], [], [], []
        num_prompt_rows = 0
        for index, c in enumerate(chunks):
            n = len(c.token_ids)
            token_ids += c.token_ids
            positions += range(c.start, c.start + n)
            row_seq += [index] * n
            prompt_end = c.start + n if c.num_prompt_tokens is None else c.num_prompt_tokens
            num_prompt_rows += max(0, min(n, prompt_end - c.start))
            logit_rows += range(len(positions) - n, len(positions)) if c.all_logits else [len(positions) - 1]
        if num_prompt_rows not in (0, num_rows):  # a mixed step picks rows apart: build's business
            return AttentionBatch.build(chunks, self.block_size, self.group_windows, self.device)
        width = max(len(table) for c in chunks for table in c.block_tables)
        shape = (tuple(len(c.token_ids) for c in chunks), tuple(c.all_logits for c in chunks), width,
                 num_prompt_rows > 0)
        if shape != self._shape:
            self._lay_out(shape, num_rows, len(logit_rows))
        slots = []
        for group in range(num_groups):
            slots += [chunks[chunk].block_tables[group][p // bs] * bs + p % bs for chunk, p in zip(row_seq, positions)]
        self._write_tables(chunks, width)
        key_begins = [max(0, p - window + 1) if window else 0 for window in self.windows for p in positions]
        self._int64[:] = token_ids + positions + logit_rows + slots
        self._int32[:len(self._int32) - self._tables.size] = row_seq + [p + 1 for p in positions] + key_begins
        return self._batch

    def _write_tables(self, chunks: list[ForwardChunk], width: int) -> None:
        """Write only the chunks' tables that changed since the last step: a sequence's tables change once a block
        (a page appended, a sliding window's page released), so at long contexts this skips nearly all of a step's
        O(blocks) conversion from Python ints. After a new layout, all of them in one assignment."""
        # Snapshots to compare with: the scheduler's are tuples already; a list may yet change in place.
        current = [c.block_tables if type(c.block_tables) is tuple and all(type(t) is tuple for t in c.block_tables)
                   else tuple(map(tuple, c.block_tables)) for c in chunks]
        if not any(self._written):
            self._tables.transpose(1, 0, 2)[:] = [[[*t, *[-1] * (width - len(t))] for t in tables] for tables in current]
        else:
            for index, tables in enumerate(current):
                if tables != self._written[index]:
                    self._tables[:, index, :] = [[*t, *[-1] * (width - len(t))] for t in tables]
        self._written = current

    def _lay_out(self, shape: tuple, num_rows: int, num_logit_rows: int) -> None:
        """Buffers for steps of this shape, and the batch of tensor views into them."""
        lengths, all_logits, width, all_prompt = shape
        num_chunks, num_groups, rows = len(lengths), len(self.group_windows), num_rows
        self._int64 = np.zeros(2 * rows + num_logit_rows + num_groups * rows, np.int64)
        self._int32 = np.zeros(2 * rows + len(self.windows) * rows + num_groups * num_chunks * width, np.int32)
        int64, int32 = torch.from_numpy(self._int64), torch.from_numpy(self._int32)
        slots_at, tables_at = 2 * rows + num_logit_rows, (2 + len(self.windows)) * rows
        self._tables = self._int32[tables_at:].reshape(num_groups, num_chunks, width)
        self._written: list[tuple | None] = [None] * num_chunks  # each chunk's tables as _tables holds them
        key_begin = {window: int32[(2 + i) * rows:(3 + i) * rows] for i, window in enumerate(self.windows)}
        groups = [GroupView(int32[tables_at + g * num_chunks * width:tables_at + (g + 1) * num_chunks * width]
                            .view(num_chunks, width),
                            int64[slots_at + g * rows:slots_at + (g + 1) * rows], key_begin[window])
                  for g, window in enumerate(self.group_windows)]
        row_starts = [0]
        for n in lengths:
            row_starts.append(row_starts[-1] + n)
        self._batch = AttentionBatch(
            token_ids=int64[:rows], positions=int64[rows:2 * rows], row_seq=int32[:rows], key_end=int32[rows:2 * rows],
            block_size=self.block_size, row_starts=row_starts, groups=groups,
            logit_rows=int64[2 * rows:2 * rows + num_logit_rows],
            logit_counts=[n if wants_all else 1 for n, wants_all in zip(lengths, all_logits)],
            row_paths=RowPaths(rows, None, None, all_prompt))
        self._shape = shape
