"""Self-attention over a paged KV cache, for a ragged batch of decode rows and prefill chunks."""

import torch
from torch import nn

from ridgeline.model.attention_batch import AttentionBatch
from ridgeline.model.layers.attention_kernel import paged_attention
from ridgeline.model.layers.kv_slots import KVSlots, kernel_pages, write_slots
from ridgeline.model.layers.norm import RMSNorm
from ridgeline.model.layers.rope import apply_rope
from ridgeline.model.layers.shared_input import SharedInputLinear
from ridgeline.model.native import NO_TENSOR, compiled, on_compiled_path


class PagedAttention(nn.Module):
    def __init__(self, qkv: SharedInputLinear, o: nn.Module, num_heads: int, num_kv_heads: int,
                 head_dim: int, scale: float, group: int, q_norm: RMSNorm | None, k_norm: RMSNorm | None,
                 sinks: torch.Tensor | None = None):
        super().__init__()
        # gpt-oss: a per-head logit in each softmax's denominator (see attention_kernel.py)
        self.register_buffer("sinks", None if sinks is None else sinks.float().contiguous(), persistent=False)
        self.qkv, self.o = qkv, o
        self.q_norm, self.k_norm = q_norm, k_norm
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.group = group  # the layer group (model/kv_groups.py) whose block tables and window this layer uses

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: AttentionBatch,
                cache: tuple[KVSlots, KVSlots]) -> torch.Tensor:
        paths = batch.row_paths
        q, k, v = self.qkv(x, paths)
        k_cache, v_cache = cache
        view = batch.groups[self.group]
        if self.head_dim % 32 == 0 and on_compiled_path(q, multiple=1):
            # QK-norm, RoPE and the cache writes (Q8_0 quantised there too) in one call: a dozen torch calls per
            # layer otherwise, two dozen with Q8_0
            norms = (NO_TENSOR, NO_TENSOR, 0.0) if self.q_norm is None else (
                self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            q = compiled().prepare_attention(q, k, v, *norms, *rope, *kernel_pages(k_cache), *kernel_pages(v_cache),
                                             view.slot_mapping)
        else:
            q = self._prepare(q, k, v, rope, k_cache, v_cache, view.slot_mapping)
        out = paged_attention(q, k_cache, v_cache, batch, view, self.scale, self.sinks)
        return self.o(out.view(x.shape[0], -1), paths)

    def _prepare(self, q, k, v, rope, k_cache, v_cache, slots) -> torch.Tensor:
        """The same in torch: [T, heads, head_dim] queries out, keys and values into their cache slots."""
        tokens = q.shape[0]
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        write_slots(k_cache, slots, k)
        write_slots(v_cache, slots, v.reshape(tokens, self.num_kv_heads, self.head_dim))
        return q
