"""Attention of every query row over its key range in the paged KV cache: the compiled kernel, or torch.

The kernel (csrc/paged_attention.cpp) computes each row on its own, reading keys straight from the pages, so
a row's bits do not depend on the batch or the chunking. The torch path (other devices, no compiler, head_dim
not a multiple of 32) gathers each chunk's keys and runs one masked SDPA call per chunk: same maths, but its
bits may depend on how the sequence was chunked.

Attention sinks (gpt-oss): one learned logit per query head joins each row's softmax denominator without a value,
so softmax(scores ++ [sink])[:-1] weighs the values. SDPA has no such term; with sinks the torch path computes
the softmax itself.

A Q8_0 cache (model/layers/kv_slots.py), on either side or both, takes the kernel too: it reads the int8 values
and fp16 scales in place and dequantises them in registers (csrc/kv_pages.h), so no float copy of the pages is
made. The torch path dequantises only the slots each chunk gathers, never the whole cache.
"""

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from ridgeline.model.attention_batch import AttentionBatch, GroupView
from ridgeline.model.layers.kv_slots import KVSlots, kernel_pages, read_slots
from ridgeline.model.native import NO_TENSOR, compiled


def paged_attention(q: torch.Tensor, k_cache: KVSlots, v_cache: KVSlots, batch: AttentionBatch,
                    group: GroupView, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, heads, head_dim]; caches [slots, kv_heads, head_dim]; sinks None or [heads] fp32
    -> [T, heads, head_dim] in q's dtype."""
    module = compiled() if q.device.type == "cpu" and q.shape[-1] % 32 == 0 else None
    if module is None:
        return paged_attention_reference(q, k_cache, v_cache, batch, group, scale, sinks)
    out = module.paged_attention(q.float().contiguous(), *kernel_pages(k_cache), *kernel_pages(v_cache),
                                 group.block_tables, batch.row_seq,
                                 group.key_begin, batch.key_end, batch.block_size, scale,
                                 NO_TENSOR if sinks is None else sinks)
    return out.to(q.dtype)


def paged_attention_reference(q: torch.Tensor, k_cache: KVSlots, v_cache: KVSlots, batch: AttentionBatch,
                              group: GroupView, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    tokens, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    begins, ends = group.key_begin.tolist(), batch.key_end.tolist()
    out = torch.empty_like(q)
    for chunk, (first, last) in enumerate(zip(batch.row_starts, batch.row_starts[1:])):
        key_pos = torch.arange(min(begins[first:last]), ends[last - 1], device=q.device)
        table = group.block_tables[chunk].long()
        slots = table[key_pos // batch.block_size] * batch.block_size + key_pos % batch.block_size
        # [kv_heads, n, d]: only this chunk's slots, dequantised where the cache is Q8_0
        keys, values = (read_slots(cache, slots, q.dtype).transpose(0, 1) for cache in (k_cache, v_cache))
        rows = last - first
        # Query heads sharing a KV head become extra queries of it: [kv_heads, groups * rows, d].
        queries = q[first:last].view(rows, kv_heads, heads // kv_heads, head_dim).permute(1, 2, 0, 3)
        begin = group.key_begin[first:last, None].long()
        end = batch.key_end[first:last, None].long()
        mask = ((key_pos >= begin) & (key_pos < end)).repeat(heads // kv_heads, 1)
        if sinks is None:
            attended = sdpa(queries.reshape(kv_heads, -1, head_dim), keys, values, attn_mask=mask, scale=scale)
        else:
            attended = _attend_with_sinks(queries.reshape(kv_heads, -1, head_dim), keys, values, mask, scale,
                                          sinks.view(kv_heads, heads // kv_heads, 1).expand(-1, -1, rows).reshape(
                                              kv_heads, -1, 1))
        out[first:last] = attended.view(kv_heads, heads // kv_heads, rows, head_dim).permute(2, 0, 1, 3).reshape(
            rows, heads, head_dim)
    return out


def _attend_with_sinks(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                       scale: float, sinks: torch.Tensor) -> torch.Tensor:
    """queries [kv_heads, n, d], keys/values [kv_heads, m, d], mask [n, m], sinks [kv_heads, n, 1]."""
    scores = (queries.float() @ keys.float().transpose(1, 2) * scale).masked_fill(~mask, float("-inf"))
    weights = torch.cat([scores, sinks.float()], dim=-1).softmax(dim=-1)[..., :-1]
    return (weights @ values.float()).to(queries.dtype)
