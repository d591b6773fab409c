"""One layer's K (or V) cache slots as attention writes and reads them: a float tensor, or Q8_0.

Q8_0 (llama.cpp's 8-bit block) keeps each token's row of kv_heads x head_dim values as int8, with one fp16 scale
per 32 consecutive values (a block never straddles two heads once head_dim is a multiple of 32). A token is
quantised once, when its K and V are written; the compiled attention kernel reads the int8 values and scales in
place and dequantises in registers, and the torch path dequantises only the slots it gathers (the pages one chunk
attends), so the cache itself stays int8 + scales: 1.0625 bytes per value against bf16's 2.
"""

import torch

from ridgeline.model.native import NO_TENSOR

Q8_BLOCK = 32


def quantize_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., n] floats (n a multiple of 32) -> int8 [..., n] and fp16 scales [..., n / 32]."""
    blocks = x.float().reshape(*x.shape[:-1], -1, Q8_BLOCK)
    # The scale is rounded to fp16 before dividing: reads multiply by the stored fp16 scale, so quantising with
    # it keeps every value within half a step of what is read back.
    scales = (blocks.abs().amax(-1, keepdim=True) / 127).half()
    steps = scales.float()
    values = torch.where(steps > 0, blocks / steps, 0.0)  # an all-zero block: scale 0, values 0
    return values.round().clamp(-127, 127).to(torch.int8).reshape(x.shape), scales.squeeze(-1)


def dequantize_q8_0(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    blocks = values.reshape(*scales.shape, Q8_BLOCK).float() * scales.float().unsqueeze(-1)
    return blocks.reshape(values.shape).to(dtype)


class Q8Slots:
    """values int8 [slots, kv_heads, head_dim], scales fp16 [slots, kv_heads * head_dim / 32]: views of the cache."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor):
        self.values, self.scales = values, scales

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        values, scales = quantize_q8_0(x.reshape(len(slots), -1))
        self.values.index_copy_(0, slots, values.view(-1, *self.values.shape[1:]))
        self.scales.index_copy_(0, slots, scales)

    def read(self, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_q8_0(self.values[slots], self.scales[slots], dtype)


KVSlots = torch.Tensor | Q8Slots


def write_slots(cache: KVSlots, slots: torch.Tensor, x: torch.Tensor) -> None:
    """x [len(slots), kv_heads, head_dim] into the cache at `slots`."""
    if isinstance(cache, Q8Slots):
        cache.write(slots, x)
    else:
        cache.index_copy_(0, slots, x.to(cache.dtype))


def read_slots(cache: KVSlots, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cache's rows at `slots` as [len(slots), kv_heads, head_dim] in `dtype`."""
    return cache.read(slots, dtype) if isinstance(cache, Q8Slots) else cache[slots].to(dtype)


def kernel_pages(cache: KVSlots) -> tuple[torch.Tensor, torch.Tensor]:
    """One side of the cache as the compiled kernels take it (csrc/kv_pages.h): float pages and an empty tensor,
    or the int8 values and their fp16 scales. They read Q8_0 in place, dequantising in registers."""
    return (cache.values, cache.scales) if isinstance(cache, Q8Slots) else (cache, NO_TENSOR)
