"""Repack GGML blocks, once at load, into planes the kernels can stream: unsigned quants + per-group scales.

Every supported type becomes `w = a * u - b` with u an unsigned integer of 4, 5, 6 or 8 bits and (a, b)
constant over a group of 32 weights (16 for Q6_K). Output rows are interleaved in blocks of 16, four input
weights at a time, so that one int8 dot-product instruction serves 16 rows (csrc/quant_kernels.cpp documents
the byte layout). The planes take the same bytes as the file, except Q4_K/Q5_K, whose 6-bit scales and mins
are unpacked to a byte each (+0.125 bits per weight). Row counts that are not a multiple of 16 are padded with
zero rows (real models never need it; tests do).
"""

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import Q4_K

from ridgeline.errors import UnsupportedError
from ridgeline.model.weights import StoredTensor, block_geometry

BLOCK_ROWS = 16  # output rows interleaved per block
QUANT_BITS = {T.Q8_0: 8, T.Q4_0: 4, T.Q5_0: 5, T.Q4_K: 4, T.Q5_K: 5, T.Q6_K: 6}
SIMPLE_OFFSETS = {T.Q8_0: 128, T.Q4_0: 8, T.Q5_0: 16}  # w = d * (u - offset) per block of 32
Q6_K_OFFSET = 32


@dataclass
class PackedWeight:
    """One [out_features, in_features] weight matrix in kernel layout, one plane row per block of 16 output rows.

    Empty planes are zero-size tensors.
    """

    qtype: T
    out_features: int
    in_features: int
    quants: torch.Tensor  # uint8 [blocks, 16 * in] (8-bit) or [blocks, 8 * in] (nibbles)
    high: torch.Tensor  # uint8 [blocks, 2 * in] (5-bit: one bit-4 mask per step) or [blocks, 4 * in] (6-bit: two)
    # fp16 scales held as their int16 bit patterns, so a model-wide .float() / .to(dtype) leaves them alone
    d: torch.Tensor  # [blocks, 16 * groups of 32] (Q8_0/Q4_0/Q5_0) or [blocks, 16 * super-blocks of 256]
    dmin: torch.Tensor  # [blocks, 16 * super-blocks] (Q4_K/Q5_K)
    sc: torch.Tensor  # uint8 [blocks, 16 * groups of 32] (Q4_K/Q5_K) or int8 [blocks, 16 * groups of 16] (Q6_K)
    m: torch.Tensor  # uint8 [blocks, 16 * groups of 32] (Q4_K/Q5_K)

    @property
    def planes(self) -> tuple[torch.Tensor, ...]:
        return (self.quants, self.high, self.d, self.dmin, self.sc, self.m)

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / (self.out_features * self.in_features)

    def to(self, device: torch.device) -> "PackedWeight":
        moved = [p.to(device) for p in self.planes]
        return PackedWeight(self.qtype, self.out_features, self.in_features, *moved)


def pack(weight: StoredTensor) -> PackedWeight:
    if weight.qtype not in QUANT_BITS or len(weight.shape) != 2:
        raise UnsupportedError(f"cannot pack a {weight.qtype.name} tensor of shape {weight.shape} for the quantised kernels")
    out_features, in_features = weight.shape
    block_size, block_bytes = block_geometry(weight.qtype)
    blocks = weight.data.numpy().reshape(out_features, in_features // block_size, block_bytes)
    u, scales = _UNPACKERS[weight.qtype](blocks)
    def flat(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array.reshape(array.shape[0], -1)))

    steps = _interleave(u)  # [blocks, steps, 64]
    bits = QUANT_BITS[weight.qtype]
    if bits == 8:
        quants = steps
    else:  # steps 2j (low nibble) and 2j + 1 (high nibble) share 64 bytes
        pairs = (steps & 0x0F).reshape(steps.shape[0], -1, 2, 64)
        quants = pairs[:, :, 0] | (pairs[:, :, 1] << 4)
    high_bits = {5: (4,), 6: (4, 5)}.get(bits, ())
    if high_bits:  # per step, one 64-bit little-endian mask per high bit
        masks = np.stack([(steps >> bit) & 1 for bit in high_bits], axis=2)  # [blocks, steps, bits, 64]
        high = flat(np.packbits(masks, axis=-1, bitorder="little"))
    else:
        high = torch.empty(0, dtype=torch.uint8)

    def plane(array: np.ndarray | None) -> torch.Tensor:
        if array is None:
            return torch.empty(0, dtype=torch.uint8)
        array = _interleave_scales(array)
        return torch.from_numpy(np.ascontiguousarray(array.view(np.int16) if array.dtype == np.float16 else array))

    return PackedWeight(
        weight.qtype, out_features, in_features, flat(quants), high,
        plane(scales.get("d")), plane(scales.get("dmin")), plane(scales.get("sc")), plane(scales.get("m")),
    )  # fmt: skip


def _padded_rows(array: np.ndarray) -> np.ndarray:
    missing = -array.shape[0] % BLOCK_ROWS
    return np.pad(array, ((0, missing),) + ((0, 0),) * (array.ndim - 1))


def _interleave(u: np.ndarray) -> np.ndarray:
    """[rows, in] quants -> [blocks, in / 4, 64]: per step of 4 weights, 4 bytes of each of the block's 16 rows."""
    u = _padded_rows(u)
    return u.reshape(-1, BLOCK_ROWS, u.shape[1] // 4, 4).transpose(0, 2, 1, 3).reshape(-1, u.shape[1] // 4, 64)


def _interleave_scales(array: np.ndarray) -> np.ndarray:
    """[rows, groups] -> [blocks, groups * 16]: per group, the value of each of the block's 16 rows."""
    array = _padded_rows(array)
    return array.reshape(-1, BLOCK_ROWS, array.shape[1]).transpose(0, 2, 1).reshape(-1, array.shape[1] * BLOCK_ROWS)


def _fp16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)[..., 0]


def _low_high_nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """GGML's nibble order: each run of `run` bytes holds weights j (low) then run + j (high)."""
    n, blocks, size = qs.shape
    runs = qs.reshape(n, blocks, size // run, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
    return (runs & 0x0F).reshape(n, blocks, 2 * size)


def _unpack_q8_0(blocks):
    u = blocks[..., 2:] ^ np.uint8(0x80)  # int8 q + 128
    return u.reshape(blocks.shape[0], -1), {"d": _fp16(blocks[..., 0:2])}


def _unpack_q4_0(blocks):
    u = _low_high_nibbles(blocks[..., 2:], 16)
    return u.reshape(blocks.shape[0], -1), {"d": _fp16(blocks[..., 0:2])}


def _unpack_q5_0(blocks):
    low = _low_high_nibbles(blocks[..., 6:], 16)
    qh = np.ascontiguousarray(blocks[..., 2:6]).view(np.uint32)
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    return (low | (high << 4)).reshape(blocks.shape[0], -1), {"d": _fp16(blocks[..., 0:2])}


def _k_scales(blocks):
    n, supers, _ = blocks.shape
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(n * supers, 12))
    return {
        "d": _fp16(blocks[..., 0:2]),
        "dmin": _fp16(blocks[..., 2:4]),
        "sc": sc.reshape(n, supers * 8),
        "m": m.reshape(n, supers * 8),
    }


def _unpack_q4_k(blocks):
    u = _low_high_nibbles(blocks[..., 16:144], 32)
    return u.reshape(blocks.shape[0], -1), _k_scales(blocks)


def _unpack_q5_k(blocks):
    low = _low_high_nibbles(blocks[..., 48:176], 32)
    qh = blocks[..., 16:48]  # bit i of byte j: weight 32 i + j
    high = (qh[:, :, None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    u = low | (high.reshape(low.shape) << 4)
    return u.reshape(blocks.shape[0], -1), _k_scales(blocks)


def _unpack_q6_k(blocks):
    n, supers, _ = blocks.shape
    low = _low_high_nibbles(blocks[..., 0:128], 64)  # halves of 128 weights: j (low), 64 + j (high)
    qh = blocks[..., 128:192].reshape(n, supers, 2, 1, 32)  # per half, bits 2k: weight 32 k + j
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 3
    u = low | (high.reshape(low.shape) << 4)
    scales = {"d": _fp16(blocks[..., 208:210]), "sc": blocks[..., 192:208].view(np.int8).reshape(n, supers * 16)}
    return u.reshape(n, -1), scales


_UNPACKERS = {
    T.Q8_0: _unpack_q8_0,
    T.Q4_0: _unpack_q4_0,
    T.Q5_0: _unpack_q5_0,
    T.Q4_K: _unpack_q4_k,
    T.Q5_K: _unpack_q5_k,
    T.Q6_K: _unpack_q6_k,
}


def dequantize_reference(weight: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The packed weight as a dense [out, in] tensor with torch ops only: the portable (any device) path."""
    rows = weight.out_features
    u = _unsigned_quants(weight).to(torch.float32)  # [blocks * 16, in]
    a, b = _group_scales(weight)  # [blocks * 16, groups]
    values = u.reshape(u.shape[0], a.shape[1], -1) * a.unsqueeze(-1) - b.unsqueeze(-1)
    return values.reshape(u.shape[0], -1)[:rows].to(dtype)


def _deinterleave(steps: torch.Tensor) -> torch.Tensor:
    """[blocks, steps, 64] -> [blocks * 16, steps * 4]."""
    blocks = steps.shape[0]
    return steps.reshape(blocks, -1, BLOCK_ROWS, 4).permute(0, 2, 1, 3).reshape(blocks * BLOCK_ROWS, -1)


def _unsigned_quants(weight: PackedWeight) -> torch.Tensor:
    blocks = weight.quants.shape[0]
    bits = QUANT_BITS[weight.qtype]
    packed = weight.quants.to(torch.int32).reshape(blocks, -1, 1, 64)
    if bits == 8:
        return _deinterleave(packed.reshape(blocks, -1, 64))
    steps = (packed >> torch.tensor([0, 4], device=packed.device).reshape(1, 1, 2, 1)) & 0x0F
    steps = steps.reshape(blocks, -1, 64)
    if bits > 4:
        masks = weight.high.to(torch.int32).reshape(blocks, steps.shape[1], bits - 4, 8, 1)
        bit_values = (masks >> torch.arange(8, device=masks.device)) & 1  # [blocks, steps, bits, 8, 8]
        for i in range(bits - 4):
            steps = steps | (bit_values[:, :, i].reshape(blocks, -1, 64) << (4 + i))
    return _deinterleave(steps)


def _group_scales(weight: PackedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row and group of 32 weights (16 for Q6_K): a and b of w = a * u - b."""
    def rows(plane: torch.Tensor) -> torch.Tensor:  # [blocks, groups * 16] -> [blocks * 16, groups]
        blocks = plane.shape[0]
        return plane.reshape(blocks, -1, BLOCK_ROWS).permute(0, 2, 1).reshape(blocks * BLOCK_ROWS, -1)

    d = rows(weight.d).view(torch.float16).to(torch.float32)
    if weight.qtype in SIMPLE_OFFSETS:
        return d, d * SIMPLE_OFFSETS[weight.qtype]
    if weight.qtype == T.Q6_K:
        a = d.repeat_interleave(16, dim=1) * rows(weight.sc).to(torch.float32)
        return a, a * Q6_K_OFFSET
    a = d.repeat_interleave(8, dim=1) * rows(weight.sc).to(torch.float32)
    b = rows(weight.dmin).view(torch.float16).to(torch.float32).repeat_interleave(8, dim=1) * rows(weight.m).to(torch.float32)
    return a, b
