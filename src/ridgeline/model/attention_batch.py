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

    rows: torch.Tensor  # [G] their rows in the flat batch
    kv_slots: torch.Tensor  # [G, keys]
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
        tables = [torch.tensor(c.block_table, dtype=torch.long) for c in chunks]

        def slots(table: torch.Tensor, begin: int, end: int) -> torch.Tensor:
            pos = torch.arange(begin, end)
            return table[pos // block_size] * block_size + pos % block_size

        row_starts = [0]
        for c in chunks:
            row_starts.append(row_starts[-1] + len(c.token_ids))
        positions = torch.cat([torch.arange(c.start, c.end) for c in chunks])
        prompt_ends = torch.cat([torch.full((len(c.token_ids),), c.end if c.num_prompt_tokens is None
                                            else c.num_prompt_tokens) for c in chunks])
        logit_rows = [r for c, start, end in zip(chunks, row_starts, row_starts[1:])
                      for r in (range(start, end) if c.all_logits else [end - 1])]

        views = {}
        for window in windows:
            def key_start(tile: int) -> int:
                return 0 if window is None else max(0, tile * block_size - window + 1)

            decodes: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
            chunk_views = []
            for c, table, row_start in zip(chunks, tables, row_starts):
                tiles = range(c.start // block_size, (c.end - 1) // block_size + 1)
                first, last = key_start(tiles[0]), (tiles[-1] + 1) * block_size
                if len(c.token_ids) == 1:
                    k_pos = torch.arange(first, last)
                    mask = k_pos <= c.start
                    if window is not None:
                        mask &= c.start - k_pos < window
                    decodes.setdefault(last - first, []).append((row_start, slots(table, first, last), mask))
                    continue
                view = ChunkView(slots(table, first, last).to(device), [])
                for tile in tiles:
                    q_begin, q_end = max(c.start, tile * block_size), min(c.end, (tile + 1) * block_size)
                    k_begin, k_end = key_start(tile), (tile + 1) * block_size
                    q_pos = torch.arange(q_begin, q_end)[:, None]
                    k_pos = torch.arange(k_begin, k_end)[None, :]
                    mask = k_pos <= q_pos
                    if window is not None:
                        mask &= q_pos - k_pos < window
                    rows = slice(row_start + q_begin - c.start, row_start + q_end - c.start)
                    view.tiles.append(Tile(rows, slice(k_begin - first, k_end - first), mask.to(device)))
                chunk_views.append(view)
            groups = [DecodeGroup(torch.tensor([r for r, _, _ in members], device=device),
                                  torch.stack([s for _, s, _ in members]).to(device),
                                  torch.stack([m for _, _, m in members])[:, None, None, :].to(device))
                      for members in decodes.values()]
            views[window] = WindowViews(groups, chunk_views)

        return AttentionBatch(
            token_ids=torch.tensor([t for c in chunks for t in c.token_ids], dtype=torch.long, device=device),
            positions=positions.to(device),
            slot_mapping=torch.cat([slots(t, c.start, c.end) for c, t in zip(chunks, tables)]).to(device),
            views=views,
            logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=device),
            logit_counts=[len(c.token_ids) if c.all_logits else 1 for c in chunks],
            row_paths=RowPaths.from_prompt_mask((positions < prompt_ends).to(device)),
        )
