"""Self-attention over a paged KV cache, for a ragged batch of decode rows and prefill chunks."""

import torch
from torch import nn
from torch.nn.functional import scaled_dot_product_attention as sdpa

from ridgeline.model.attention_batch import AttentionBatch
from ridgeline.model.layers.norm import RMSNorm
from ridgeline.model.layers.rope import apply_rope


class PagedAttention(nn.Module):
    def __init__(self, q: nn.Module, k: nn.Module, v: nn.Module, o: nn.Module, num_heads: int, num_kv_heads: int,
                 head_dim: int, scale: float, window: int | None, q_norm: RMSNorm | None, k_norm: RMSNorm | None):
        super().__init__()
        self.q, self.k, self.v, self.o = q, k, v, o
        # Queries and keys are normalised and rotated side by side, [heads + kv_heads, head_dim] per token:
        # one call each instead of two (a decode step is dominated by per-call overhead).
        self.qk_norm = None if q_norm is None else RMSNorm(
            torch.cat((q_norm.weight.expand(num_heads, -1), k_norm.weight.expand(num_kv_heads, -1))), q_norm.eps)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.groups = num_heads // num_kv_heads
        self.scale, self.window = scale, window

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: AttentionBatch,
                cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens = x.shape[0]
        paths = batch.row_paths
        q = self.q(x, paths).view(tokens, self.num_heads, self.head_dim)
        k = self.k(x, paths).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v(x, paths).view(tokens, self.num_kv_heads, self.head_dim)
        qk = torch.cat((q, k), dim=1)
        if self.qk_norm is not None:
            qk = self.qk_norm(qk)
        q, k = apply_rope(qk, *rope).split((self.num_heads, self.num_kv_heads), dim=1)

        k_cache, v_cache = cache
        k_cache.index_copy_(0, batch.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.slot_mapping, v.to(v_cache.dtype))

        out = q.new_empty(tokens, self.num_heads, self.head_dim)
        views = batch.views[self.window]
        for group in views.decodes:
            out[group.rows] = self._decodes(q[group.rows], group, k_cache, v_cache)
        for chunk in views.chunks:
            keys = k_cache[chunk.kv_slots].to(q.dtype).transpose(0, 1)  # [kv_heads, keys, head_dim]
            values = v_cache[chunk.kv_slots].to(q.dtype).transpose(0, 1)
            for tile in chunk.tiles:
                out[tile.rows] = self._tile(q[tile.rows], keys[:, tile.keys], values[:, tile.keys], tile.mask)
        return self.o(out.view(tokens, -1), paths)

    def _decodes(self, q, group, k_cache, v_cache):
        """One-row tiles of several sequences: [G, kv_heads, groups, d] queries against [G, kv_heads, keys, d]."""
        rows, keys = q.shape[0], group.mask.shape[-1]
        # index_select on the flat slot list: several times cheaper than advanced indexing with a [G, keys] index
        keys_, values = (cache.index_select(0, group.kv_slots).view(rows, keys, self.num_kv_heads, self.head_dim)
                         .to(q.dtype).permute(0, 2, 1, 3) for cache in (k_cache, v_cache))
        queries = q.view(rows, self.num_kv_heads, self.groups, self.head_dim)
        out = sdpa(queries, keys_, values, attn_mask=group.mask, scale=self.scale)
        return out.reshape(rows, self.num_heads, self.head_dim)

    def _tile(self, q, keys, values, mask):
        """The query heads sharing a KV head are laid out as extra queries (fast GQA)."""
        length = q.shape[0]
        queries = q.view(length, self.num_kv_heads, self.groups, self.head_dim).permute(1, 2, 0, 3)
        queries = queries.reshape(1, self.num_kv_heads, self.groups * length, self.head_dim)
        # 4-D like _decodes: SDPA sends 3-D inputs to its math backend and 4-D ones to its flash kernel, whose
        # bits differ; on the same backend a row gets the same bits as a decode as in a tile.
        out = sdpa(queries, keys[None], values[None], attn_mask=mask.repeat(self.groups, 1), scale=self.scale)
        out = out.view(self.num_kv_heads, self.groups, length, self.head_dim).permute(2, 0, 1, 3)
        return out.reshape(length, self.num_heads, self.head_dim)
