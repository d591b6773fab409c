"""The paged KV cache: one pool of pages shared by all layer groups (see model/kv_groups.py).

A page holds block_size tokens of K and V for the layers of one group. Page p of layer group g is slots
[p*block_size, (p+1)*block_size) of that group's layers, and each group has its own block table per sequence,
so moving a sequence's KV to another worker means copying its pages' slots of `data`.
"""

from dataclasses import dataclass

import torch

from ridgeline.errors import RidgelineError
from ridgeline.model.config import ModelConfig
from ridgeline.model.kv_groups import layer_groups

KV_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class KVCacheConfig:
    block_size: int = 16
    dtype: str = "bf16"
    memory_bytes: int = 2 << 30  # budget for K and V of all layers

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype not in KV_DTYPES:
            raise RidgelineError(f"unknown KV cache dtype {self.dtype!r} (choose from {', '.join(KV_DTYPES)})")
        return KV_DTYPES[self.dtype]


def bytes_per_token(model: ModelConfig, cache: KVCacheConfig) -> int:
    return int(model.kv_bytes_per_token(cache.torch_dtype.itemsize))


def blocks_for_budget(model: ModelConfig, cache: KVCacheConfig) -> int:
    blocks = cache.memory_bytes // (bytes_per_token(model, cache) * cache.block_size)
    if blocks < 1:
        raise RidgelineError(f"KV cache budget of {cache.memory_bytes} bytes holds not even one block of {cache.block_size} tokens")
    return int(blocks)


class KVCache:
    def __init__(self, model: ModelConfig, cache: KVCacheConfig, num_pages: int, device: torch.device):
        self.block_size, self.num_pages = cache.block_size, num_pages
        self.groups = layer_groups(model)
        # [layer within group, K/V, slot, kv_heads, head_dim]: each layer's K (or V) is one contiguous
        # [slots, kv_heads, head_dim] tensor that the attention kernel indexes by slot.
        self.data = torch.zeros(len(self.groups[0].layers), 2, num_pages * cache.block_size, model.num_kv_heads,
                                model.head_dim, dtype=cache.torch_dtype, device=device)

    @classmethod
    def for_blocks(cls, model: ModelConfig, cache: KVCacheConfig, num_blocks: int, device: torch.device) -> "KVCache":
        """A pool where each of `num_blocks` blocks has a page in every group (see group_tables)."""
        return cls(model, cache, num_blocks * len(layer_groups(model)), device)

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(K, V) of every layer, in layer order."""
        where = {layer: index for group in self.groups for index, layer in enumerate(group.layers)}
        return [(self.data[where[i], 0], self.data[where[i], 1]) for i in sorted(where)]

    def group_tables(self, blocks: list[int]) -> list[list[int]]:
        """Block tables of a sequence holding `blocks` when each block owns a page in every group (page
        block * groups + group): for running sequences without the engine's block manager."""
        count = len(self.groups)
        if blocks and max(blocks) * count + count > self.num_pages:
            raise RidgelineError(f"block {max(blocks)} needs {max(blocks) * count + count} pages; the cache has {self.num_pages}")
        return [[block * count + group for block in blocks] for group in range(count)]


def describe_capacity(model: ModelConfig, cache: KVCacheConfig, num_blocks: int, seq_len: int = 2048) -> str:
    """The start-up line: how many tokens, and how many sequences of `seq_len` tokens, the pool holds."""
    per_token = bytes_per_token(model, cache)
    tokens = num_blocks * cache.block_size
    per_seq_blocks = -(-seq_len // cache.block_size)
    return (f"KV cache: {num_blocks:,} blocks x {cache.block_size} tokens = {tokens:,} tokens "
            f"({per_token:,} B/token in {cache.dtype}: 2 x {model.num_kv_heads} kv_heads x {model.head_dim} head_dim "
            f"x {model.num_layers} layers x {cache.torch_dtype.itemsize} B), "
            f"{num_blocks // per_seq_blocks:,} sequences of {seq_len:,} tokens")
