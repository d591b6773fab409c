"""What one forward pass computes: chunks of tokens from several sequences, and where their keys live in the paged cache.

The engine describes a step as a list of `SeqChunk`s (decode rows are 1-token chunks; prefill chunks are longer).
`AttentionBatch.build` turns that into flat token rows plus, for every attention window the model uses
(None = global), the cache slots each query reads and the mask that keeps it causal and inside its window.
It is built once per step and shared by all layers.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class SeqChunk:
    token_ids: list[int]  # tokens to compute this step
    start: int  # position of token_ids[0] in its sequence
    block_table: list[int]  # cache blocks of the sequence, covering positions [0, start + len(token_ids))
    all_logits: bool = False  # logits for every token (perplexity, prompt logprobs) instead of just the last

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass
class PrefillView:
    rows: slice  # this chunk's rows in the flat batch
    kv_slots: torch.Tensor  # [Lk] cache slots the chunk attends to
    mask: torch.Tensor  # [Lq, Lk] bool, True = may attend


@dataclass
class WindowView:
    """How the queries of one step read the cache for one attention window."""

    single_kv_slots: torch.Tensor | None  # [S, Lmax] for the 1-token chunks (decodes), padded
    single_mask: torch.Tensor | None  # [S, 1, 1, Lmax] bool
    prefills: list[PrefillView] = field(default_factory=list)


@dataclass
class AttentionBatch:
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] where each token's K and V are written
    num_single: int  # rows [0, num_single) are 1-token chunks, attended in one batched call
    views: dict[int | None, WindowView]
    logit_rows: torch.Tensor  # rows whose logits are wanted, in chunk order
    logit_counts: list[int]  # how many logit rows each chunk (in the caller's order) gets

    @staticmethod
    def build(chunks: list[SeqChunk], block_size: int, windows: set[int | None], device: torch.device) -> "AttentionBatch":
        # 1-token chunks first so decodes are one batched attention call; the caller's order is kept for logits.
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) != 1)
        ordered = [chunks[i] for i in order]
        num_single = sum(1 for c in ordered if len(c.token_ids) == 1)
        tables = [torch.tensor(c.block_table, dtype=torch.long) for c in ordered]

        def slots(table: torch.Tensor, begin: int, end: int) -> torch.Tensor:
            pos = torch.arange(begin, end)
            return table[pos // block_size] * block_size + pos % block_size

        token_ids = torch.tensor([t for c in ordered for t in c.token_ids], dtype=torch.long)
        positions = torch.cat([torch.arange(c.start, c.end) for c in ordered])
        slot_mapping = torch.cat([slots(t, c.start, c.end) for c, t in zip(ordered, tables)])

        row_starts, row = [], 0
        for c in ordered:
            row_starts.append(row)
            row += len(c.token_ids)
        logit_rows_by_chunk = {}
        for i, c, r in zip(order, ordered, row_starts):
            n = len(c.token_ids)
            logit_rows_by_chunk[i] = list(range(r, r + n)) if c.all_logits else [r + n - 1]
        logit_rows = [r for i in range(len(chunks)) for r in logit_rows_by_chunk[i]]

        views = {}
        for window in windows:
            first = [0 if window is None else max(0, c.start - window + 1) for c in ordered]
            single_slots = single_mask = None
            if num_single:
                lengths = [ordered[i].end - first[i] for i in range(num_single)]
                longest = max(lengths)
                single_slots = torch.zeros(num_single, longest, dtype=torch.long)
                single_mask = torch.zeros(num_single, longest, dtype=torch.bool)
                for i in range(num_single):
                    single_slots[i, : lengths[i]] = slots(tables[i], first[i], ordered[i].end)
                    single_mask[i, : lengths[i]] = True
                single_slots, single_mask = single_slots.to(device), single_mask[:, None, None, :].to(device)
            prefills = []
            for i in range(num_single, len(ordered)):
                c = ordered[i]
                q_pos = torch.arange(c.start, c.end)[:, None]
                k_pos = torch.arange(first[i], c.end)[None, :]
                mask = k_pos <= q_pos
                if window is not None:
                    mask &= q_pos - k_pos < window
                rows = slice(row_starts[i], row_starts[i] + len(c.token_ids))
                prefills.append(PrefillView(rows, slots(tables[i], first[i], c.end).to(device), mask.to(device)))
            views[window] = WindowView(single_slots, single_mask, prefills)

        return AttentionBatch(
            token_ids=token_ids.to(device),
            positions=positions.to(device),
            slot_mapping=slot_mapping.to(device),
            num_single=num_single,
            views=views,
            logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=device),
            logit_counts=[len(logit_rows_by_chunk[i]) for i in range(len(chunks))],
        )
