"""The paged KV cache: per layer, a pool of fixed-size blocks of key and value slots.

All layers share one block table per sequence (block b holds slots [b*block_size, (b+1)*block_size) in every
layer), so moving a sequence's KV to another worker means copying its blocks' rows of `data`.
"""

from dataclasses import dataclass

import torch

from ridgeline.errors import RidgelineError
from ridgeline.model.config import ModelConfig

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
    def __init__(self, model: ModelConfig, cache: KVCacheConfig, num_blocks: int, device: torch.device):
        self.block_size, self.num_blocks = cache.block_size, num_blocks
        self.data = torch.zeros(model.num_layers, 2, num_blocks * cache.block_size, model.num_kv_heads,
                                model.head_dim, dtype=cache.torch_dtype, device=device)

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer[0], layer[1]) for layer in self.data]


def describe_capacity(model: ModelConfig, cache: KVCacheConfig, num_blocks: int, seq_len: int = 2048) -> str:
    """The start-up line: how many tokens, and how many sequences of `seq_len` tokens, the pool holds."""
    per_token = bytes_per_token(model, cache)
    tokens = num_blocks * cache.block_size
    per_seq_blocks = -(-seq_len // cache.block_size)
    return (f"KV cache: {num_blocks:,} blocks x {cache.block_size} tokens = {tokens:,} tokens "
            f"({per_token:,} B/token in {cache.dtype}: 2 x {model.num_kv_heads} kv_heads x {model.head_dim} head_dim "
            f"x {model.num_layers} layers x {cache.torch_dtype.itemsize} B), "
            f"{num_blocks // per_seq_blocks:,} sequences of {seq_len:,} tokens")
