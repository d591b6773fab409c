"""Which matmul path each row of a step takes: the one fact the linear layers need from the attention batch.

Its own module because both sides use it: model/attention_batch.py computes it once per step and
model/layers/ consume it, so neither imports the other for it.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowPaths:
    """Which rows of a step's activations are prompt rows (compute-bound path); the rest are generated rows."""

    num_rows: int
    compute_rows: torch.Tensor | None  # None when the split is all-or-nothing
    memory_rows: torch.Tensor | None
    all_compute: bool

    @staticmethod
    def from_prompt_mask(is_prompt: torch.Tensor) -> "RowPaths":
        prompt_count = int(is_prompt.sum())
        if prompt_count in (0, len(is_prompt)):
            return RowPaths(len(is_prompt), None, None, prompt_count > 0)
        return RowPaths(len(is_prompt), is_prompt.nonzero().squeeze(1), (~is_prompt).nonzero().squeeze(1), False)

    @staticmethod
    def memory_bound(num_rows: int) -> "RowPaths":
        return RowPaths(num_rows, None, None, False)
