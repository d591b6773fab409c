"""Self-attention over a paged KV cache, for a ragged batch of decode rows and prefill chunks."""

import torch
from torch import nn

from ridgeline.model.attention_batch import AttentionBatch
from ridgeline.model.layers.attention_kernel import paged_attention
from ridgeline.model.layers.norm import RMSNorm
from ridgeline.model.layers.rope import apply_rope


class PagedAttention(nn.Module):
    def __init__(self, q: nn.Module, k: nn.Module, v: nn.Module, o: nn.Module, num_heads: int, num_kv_heads: int,
                 head_dim: int, scale: float, group: int, q_norm: RMSNorm | None, k_norm: RMSNorm | None):
        super().__init__()
        self.q, self.k, self.v, self.o = q, k, v, o
        # Queries and keys are normalised and rotated side by side, [heads + kv_heads, head_dim] per token:
        # one call each instead of two (a decode step is dominated by per-call overhead).
        self.qk_norm = None if q_norm is None else RMSNorm(
            torch.cat((q_norm.weight.expand(num_heads, -1), k_norm.weight.expand(num_kv_heads, -1))), q_norm.eps)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.group = group  # the layer group (model/kv_groups.py) whose block tables and window this layer uses

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
        view = batch.groups[self.group]
        k_cache.index_copy_(0, view.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, view.slot_mapping, v.to(v_cache.dtype))
        out = paged_attention(q, k_cache, v_cache, batch, view, self.scale)
        return self.o(out.view(tokens, -1), paths)
