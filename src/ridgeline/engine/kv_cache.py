"""The paged KV cache: one pool of pages shared by all layer groups (see model/kv_groups.py).

A page holds block_size tokens of K and V for the layers of one group. Page p of layer group g is slots
[p*block_size, (p+1)*block_size) of that group's layers, and each group has its own block table per sequence,
so moving a sequence's KV to another worker means copying its pages' slots of every tensor in `tensors`.

K and V each have an element type (llama.cpp's -ctk / -ctv): a float type, or Q8_0, whose int8 values and fp16
block scales are two tensors of the same slots (model/layers/kv_slots.py). What each costs is napkin/kv_dtypes.py.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from ridgeline.engine.block_manager import longest_fitting_sequence, pages_held
from ridgeline.errors import RidgelineError
from ridgeline.model.config import ModelConfig
from ridgeline.model.kv_groups import layer_groups
from ridgeline.model.layers.kv_slots import Q8_BLOCK, KVSlots, Q8Slots
from ridgeline.napkin.kv_dtypes import kv_bytes_per_value, kv_dtype

FLOAT_STORAGE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class KVCacheConfig:
    block_size: int = 16
    dtype: str = "bf16"  # K and V, unless key_dtype or value_dtype names one side apart
    memory_bytes: int = 2 << 30  # budget for K and V of all layers
    key_dtype: str | None = None
    value_dtype: str | None = None

    def __post_init__(self):
        kv_dtype(self.k_dtype), kv_dtype(self.v_dtype)  # an unknown name fails here, naming the choices

    @property
    def k_dtype(self) -> str:
        return self.key_dtype or self.dtype

    @property
    def v_dtype(self) -> str:
        return self.value_dtype or self.dtype

    @property
    def name(self) -> str:
        """'q8_0', or 'K q8_0 / V bf16' when the sides differ."""
        return self.k_dtype if self.k_dtype == self.v_dtype else f"K {self.k_dtype} / V {self.v_dtype}"

    @property
    def bytes_per_value(self) -> float:
        """Bytes per cached element, K and V averaged (scales included): what the roofline and simulator take."""
        return kv_bytes_per_value(self.k_dtype, self.v_dtype)


def bytes_per_token(model: ModelConfig, cache: KVCacheConfig) -> int:
    """K and V of one token in every layer: 2 x kv_heads x head_dim x layers x bytes per value."""
    return int(model.kv_bytes_per_token(cache.bytes_per_value))


def page_bytes(model: ModelConfig, cache: KVCacheConfig) -> int:
    """One page: block_size tokens of K and V in the layers of one group (every group has as many layers)."""
    layers_per_group = len(layer_groups(model)[0].layers)
    return bytes_per_token(model, cache) // model.num_layers * layers_per_group * cache.block_size


def pages_for_budget(model: ModelConfig, cache: KVCacheConfig) -> int:
    pages = cache.memory_bytes // page_bytes(model, cache)
    if pages < len(layer_groups(model)):  # a sequence's first token needs a page in every group
        raise RidgelineError(f"KV cache budget of {cache.memory_bytes} bytes holds not even one block of "
                             f"{cache.block_size} tokens in every layer")
    return int(pages)


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros; on the CPU straight from the OS's zero pages (numpy's large allocations are fresh mappings), so
    start-up does not write gigabytes of zeros and a page costs memory only once a token is written to it."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).reshape(shape)


def side_tensors(dtype: str, layers: int, slots: int, model: ModelConfig, device: torch.device) -> list[torch.Tensor]:
    """The tensors holding K (or V) of `layers` layers, each [layer, slot, ...]: each layer's part is one contiguous
    [slots, kv_heads, head_dim] tensor the attention kernel indexes by slot, plus Q8_0's scales."""
    shape = (layers, slots, model.num_kv_heads, model.head_dim)
    if dtype in FLOAT_STORAGE:
        return [zeroed(shape, FLOAT_STORAGE[dtype], device)]
    row = model.num_kv_heads * model.head_dim
    if row % Q8_BLOCK:
        raise RidgelineError(f"a {dtype} KV cache quantises blocks of {Q8_BLOCK} values; this model's K and V rows "
                             f"have {row} (kv_heads x head_dim)")
    return [zeroed(shape, torch.int8, device), zeroed((layers, slots, row // Q8_BLOCK), torch.float16, device)]


class KVCache:
    def __init__(self, model: ModelConfig, cache: KVCacheConfig, num_pages: int, device: torch.device):
        self.block_size, self.num_pages = cache.block_size, num_pages
        self.groups = layer_groups(model)
        layers, slots = len(self.groups[0].layers), num_pages * cache.block_size
        self.sides = [side_tensors(dtype, layers, slots, model, device) for dtype in (cache.k_dtype, cache.v_dtype)]

    @property
    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the cache, K's then V's, each [layer within group, slot, ...]: a page is their slots."""
        return [tensor for side in self.sides for tensor in side]

    @classmethod
    def for_blocks(cls, model: ModelConfig, cache: KVCacheConfig, num_blocks: int, device: torch.device) -> "KVCache":
        """A pool where each of `num_blocks` blocks has a page in every group (see group_tables)."""
        return cls(model, cache, num_blocks * len(layer_groups(model)), device)

    def layers(self) -> list[tuple[KVSlots, KVSlots]]:
        """(K, V) of every layer, in layer order."""
        where = {layer: index for group in self.groups for index, layer in enumerate(group.layers)}

        def slots(side: list[torch.Tensor], index: int) -> KVSlots:
            return side[0][index] if len(side) == 1 else Q8Slots(side[0][index], side[1][index])

        return [(slots(self.sides[0], where[i]), slots(self.sides[1], where[i])) for i in sorted(where)]

    def group_tables(self, blocks: list[int]) -> list[list[int]]:
        """Block tables of a sequence holding `blocks` when each block owns a page in every group (page
        block * groups + group): for running sequences without the engine's block manager."""
        count = len(self.groups)
        if blocks and max(blocks) * count + count > self.num_pages:
            raise RidgelineError(f"block {max(blocks)} needs {max(blocks) * count + count} pages; the cache has {self.num_pages}")
        return [[block * count + group for block in blocks] for group in range(count)]


def pages_per_sequence(model: ModelConfig, cache: KVCacheConfig, seq_len: int) -> int:
    """Pages one sequence of seq_len tokens holds: every block in a full-attention group, the window's in a
    sliding-window group."""
    return sum(pages_held(seq_len, 0, group.window, cache.block_size) for group in layer_groups(model))


def describe_capacity(model: ModelConfig, cache: KVCacheConfig, num_pages: int, max_chunk_tokens: int,
                      seq_len: int = 2048) -> str:
    """The start-up line: how many tokens of every layer the pool holds, what a token costs past the sliding
    window (only the full-attention layers keep it), how many sequences of `seq_len` tokens fit when the
    sliding-window groups keep only their window's pages, and the longest sequence that fits at all (prefill
    chunks of up to max_chunk_tokens hold pages for all their tokens while they run)."""
    groups = layer_groups(model)
    windows = [group.window for group in groups]
    per_token = bytes_per_token(model, cache)
    tokens = num_pages * cache.block_size // len(groups)
    per_seq_pages = pages_per_sequence(model, cache, seq_len)
    longest = longest_fitting_sequence(num_pages, max_chunk_tokens, windows, cache.block_size, model.max_context)
    line = (f"KV cache: {num_pages:,} pages x {cache.block_size} tokens x {len(groups[0].layers)} layers = {tokens:,} "
            f"tokens of all layers ({per_token:,} B/token in {cache.name}: 2 x {model.num_kv_heads} kv_heads x "
            f"{model.head_dim} head_dim x {model.num_layers} layers x {cache.bytes_per_value:g} B)")
    if model.sliding_layers:
        num_full = model.num_layers - len(model.sliding_layers)
        line += (f"; past the {model.sliding_window:,}-token sliding window a token costs "
                 f"{per_token * num_full // model.num_layers:,} B (only the {num_full} full-attention layers keep it)")
    return (line + f"; {num_pages // per_seq_pages:,} sequences of {seq_len:,} tokens ({per_seq_pages:,} pages each)"
            f"; one sequence up to {longest:,} tokens" + (" (the model's context)" if longest == model.max_context else ""))
