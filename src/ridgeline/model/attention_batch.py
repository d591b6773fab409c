"""What one forward pass computes: chunks of tokens from several sequences, and where their keys live in the paged cache.

The engine describes a step as a list of `SeqChunk`s (a decode is a 1-token chunk; prefill chunks are longer).
`AttentionBatch.build` turns that into flat token rows plus, for every attention window the model uses
(None = global), the cache slots each chunk reads and the mask that keeps it causal and inside its window.
It is built once per step and shared by all layers.

A request's tokens must not depend on how it was batched or chunked, and attention's float sums change with the
key length they run over. So queries attend in tiles fixed by absolute position: the rows of positions
[16k, 16k + 16) read keys [window start of 16k, 16k + 16) under a causal/window mask, whichever step computes
them (a decode is a one-row tile). Keys past a row's own position are masked to exact zeros. One-row tiles with
equal key counts (decodes; past the window, every sliding-window decode) share one batched call: batch entries
are computed independently, so that changes no bits.
"""

from dataclasses import dataclass
from itertools import accumulate

import torch

from ridgeline.model.layers.linear import RowPaths


@dataclass
class SeqChunk:
    token_ids: list[int]  # tokens to compute this step
    start: int  # position of token_ids[0] in its sequence
    block_table: list[int]  # cache blocks of the sequence, covering positions [0, start + len(token_ids))
    all_logits: bool = False  # logits for every token (perplexity, prompt logprobs) instead of just the last
    # Positions before this are prompt tokens, the rest were generated (None: all are prompt tokens).
    # It picks each row's matmul path (see RowPaths), so it must not depend on how the request was batched.
    num_prompt_tokens: int | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass
class Tile:
    rows: slice  # the tile's query rows in the flat batch
    keys: slice  # its keys, as a range of the chunk's gathered keys
    mask: torch.Tensor  # [rows, keys] bool, True = may attend


@dataclass
class ChunkView:
    kv_slots: torch.Tensor  # cache slots of every key any tile of the chunk reads, gathered once per layer
    tiles: list[Tile]


@dataclass
class DecodeGroup:
    """One-row tiles with the same key count, attended in one batched call."""

    rows: slice | torch.Tensor  # their rows in the flat batch: a slice when consecutive (as in an all-decode step)
    kv_slots: torch.Tensor  # [G * keys] cache slots, sequence by sequence
    mask: torch.Tensor  # [G, 1, 1, keys] bool


@dataclass
class WindowViews:
    decodes: list[DecodeGroup]
    chunks: list[ChunkView]  # multi-token chunks, tile by tile


@dataclass
class AttentionBatch:
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] where each token's K and V are written
    views: dict[int | None, WindowViews]  # per attention window
    logit_rows: torch.Tensor  # rows whose logits are wanted, in chunk order
    logit_counts: list[int]  # how many logit rows each chunk gets
    row_paths: RowPaths  # which rows take the memory-bound and which the compute-bound matmul path

    @staticmethod
    def build(chunks: list[SeqChunk], block_size: int, windows: set[int | None], device: torch.device) -> "AttentionBatch":
        # Per-token lists are built in Python and per-group tensors in a few vectorised ops: a decode step of B
        # sequences would otherwise spend a dozen small torch calls per sequence and window.
        row_starts = list(accumulate((len(c.token_ids) for c in chunks), initial=0))
        positions = [p for c in chunks for p in range(c.start, c.end)]
        is_prompt = [p < (c.end if c.num_prompt_tokens is None else c.num_prompt_tokens)
                     for c in chunks for p in range(c.start, c.end)]
        slot_mapping = [c.block_table[p // block_size] * block_size + p % block_size
                        for c in chunks for p in range(c.start, c.end)]
        logit_rows = [r for c, start, end in zip(chunks, row_starts, row_starts[1:])
                      for r in (range(start, end) if c.all_logits else [end - 1])]
        decodes = [(row, c) for c, row in zip(chunks, row_starts) if len(c.token_ids) == 1]
        prefills = [(row, c) for c, row in zip(chunks, row_starts) if len(c.token_ids) > 1]
        layout = _Layout(block_size, device)
        views = {window: WindowViews(layout.decode_groups(decodes, window),
                                     [layout.chunk_view(c, row, window) for row, c in prefills])
                 for window in windows}
        return AttentionBatch(
            token_ids=torch.tensor([t for c in chunks for t in c.token_ids], dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=device),
            views=views,
            logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=device),
            logit_counts=[len(c.token_ids) if c.all_logits else 1 for c in chunks],
            row_paths=RowPaths.from_prompt_mask(torch.tensor(is_prompt, dtype=torch.bool, device=device)),
        )


@dataclass
class _Layout:
    """Where the keys of each tile live and which of them it may see, for one step."""

    block_size: int
    device: torch.device

    def key_start(self, tile: int, window: int | None) -> int:
        return 0 if window is None else max(0, tile * self.block_size - window + 1)

    def slots(self, tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slots of `positions` [G, n] in the sequences with block tables `tables` [G, blocks]."""
        return tables.gather(1, positions // self.block_size) * self.block_size + positions % self.block_size

    def decode_groups(self, decodes: list[tuple[int, SeqChunk]], window: int | None) -> list[DecodeGroup]:
        by_keys: dict[int, list[tuple[int, SeqChunk, int]]] = {}
        for row, c in decodes:
            tile = c.start // self.block_size
            first = self.key_start(tile, window)
            by_keys.setdefault((tile + 1) * self.block_size - first, []).append((row, c, first))
        groups = []
        for keys, members in by_keys.items():
            # the blocks up to each query's own, zero-padded to a rectangle (padding is never read)
            width = max(c.start // self.block_size + 1 for _, c, _ in members)
            tables = torch.tensor([(c.block_table + [0] * width)[:width] for _, c, _ in members])
            k_pos = torch.tensor([first for _, _, first in members])[:, None] + torch.arange(keys)
            q_pos = torch.tensor([c.start for _, c, _ in members])[:, None]
            rows = [row for row, _, _ in members]
            consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
            groups.append(DecodeGroup(
                slice(rows[0], rows[0] + len(rows)) if consecutive else torch.tensor(rows, device=self.device),
                self.slots(tables, k_pos).view(-1).to(self.device),
                attend_mask(q_pos, k_pos, window)[:, None, None, :].to(self.device),
            ))
        return groups

    def chunk_view(self, c: SeqChunk, row_start: int, window: int | None) -> ChunkView:
        tiles = range(c.start // self.block_size, (c.end - 1) // self.block_size + 1)
        first, last = self.key_start(tiles[0], window), (tiles[-1] + 1) * self.block_size
        table = torch.tensor(c.block_table, dtype=torch.long)[None, :]
        view = ChunkView(self.slots(table, torch.arange(first, last)[None, :])[0].to(self.device), [])
        for tile in tiles:
            q_begin, q_end = max(c.start, tile * self.block_size), min(c.end, (tile + 1) * self.block_size)
            k_begin, k_end = self.key_start(tile, window), (tile + 1) * self.block_size
            mask = attend_mask(torch.arange(q_begin, q_end)[:, None], torch.arange(k_begin, k_end)[None, :], window)
            rows = slice(row_start + q_begin - c.start, row_start + q_end - c.start)
            view.tiles.append(Tile(rows, slice(k_begin - first, k_end - first), mask.to(self.device)))
        return view


def attend_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """True where a query may attend a key: causal, and inside the sliding window if there is one."""
    mask = k_pos <= q_pos
    if window is not None:
        mask &= q_pos - k_pos < window
    return mask
