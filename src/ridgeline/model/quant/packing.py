"""Repack GGML blocks, once at load, into planes the kernels can stream: unsigned quants + per-sub-block scales.

Every supported type becomes `w = a * u - b` with u an unsigned integer of 4, 5, 6 or 8 bits and (a, b)
constant over a sub-block of 16 or 32 weights (csrc/quant_kernels.cpp documents the byte layout). The
planes take the same bytes as the file, except Q4_K/Q5_K, whose 6-bit scales and mins are unpacked to a
byte each (+0.125 bits per weight). Input dims that are not a multiple of 128 are padded with zero-scale
blocks (real models never need it; tests do).
"""

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import Q4_K

from ridgeline.errors import UnsupportedError
from ridgeline.model.weights import StoredTensor, block_geometry

CHUNK = 128  # weights per kernel chunk along the input dim
QUANT_BITS = {T.Q8_0: 8, T.Q4_0: 4, T.Q5_0: 5, T.Q4_K: 4, T.Q5_K: 5, T.Q6_K: 6}
SIMPLE_OFFSETS = {T.Q8_0: 128, T.Q4_0: 8, T.Q5_0: 16}  # w = d * (u - offset) per block of 32
Q6_K_OFFSET = 32


@dataclass
class PackedWeight:
    """One [out_features, in_features] weight matrix in kernel layout. Empty planes are zero-size tensors."""

    qtype: T
    out_features: int
    in_features: int
    padded_in: int
    quants: torch.Tensor  # uint8 [out, padded_in] (8-bit) or [out, padded_in / 2] (nibbles)
    high: torch.Tensor  # uint8 [out, padded_in / 8] (5-bit) or [out, padded_in / 4] (6-bit)
    # fp16 scales held as their int16 bit patterns, so a model-wide .float() / .to(dtype) leaves them alone
    d: torch.Tensor  # [out, blocks of 32] (Q8_0/Q4_0/Q5_0) or [out, super-blocks of 256]
    dmin: torch.Tensor  # [out, super-blocks] (Q4_K/Q5_K)
    sc: torch.Tensor  # uint8 [out, 32-wide sub-blocks] (Q4_K/Q5_K) or int8 [out, 16-wide sub-blocks] (Q6_K)
    m: torch.Tensor  # uint8 [out, 32-wide sub-blocks] (Q4_K/Q5_K)

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
        return PackedWeight(self.qtype, self.out_features, self.in_features, self.padded_in, *moved)

    def select_rows(self, rows: torch.Tensor) -> "PackedWeight":
        picked = [p[rows] if p.numel() else p for p in self.planes]
        return PackedWeight(self.qtype, len(rows), self.in_features, self.padded_in, *picked)


def pack(weight: StoredTensor) -> PackedWeight:
    if weight.qtype not in QUANT_BITS or len(weight.shape) != 2:
        raise UnsupportedError(f"cannot pack a {weight.qtype.name} tensor of shape {weight.shape} for the quantised kernels")
    out_features, in_features = weight.shape
    block_size, block_bytes = block_geometry(weight.qtype)
    blocks = weight.data.numpy().reshape(out_features, in_features // block_size, block_bytes)
    u, scales = _UNPACKERS[weight.qtype](blocks)
    padded_in = -(-in_features // CHUNK) * CHUNK
    u = np.pad(u, ((0, 0), (0, padded_in - in_features)))
    if weight.qtype in SIMPLE_OFFSETS:  # zero scale on padded blocks makes them contribute nothing
        scales["d"] = np.pad(scales["d"], ((0, 0), (0, (padded_in - in_features) // 32)))
    bits = QUANT_BITS[weight.qtype]
    quants = u if bits == 8 else _nibbles(u)
    high = {5: _high_bit, 6: _high_two_bits}.get(bits, lambda _: np.zeros((0, 0), np.uint8))(u)

    def plane(name: str) -> torch.Tensor:
        array = scales.get(name)
        if array is None:
            return torch.empty(0, dtype=torch.uint8)
        return torch.from_numpy(np.ascontiguousarray(array.view(np.int16) if array.dtype == np.float16 else array))

    return PackedWeight(
        weight.qtype, out_features, in_features, padded_in,
        torch.from_numpy(np.ascontiguousarray(quants)), torch.from_numpy(np.ascontiguousarray(high)),
        plane("d"), plane("dmin"), plane("sc"), plane("m"),
    )  # fmt: skip


def _nibbles(u: np.ndarray) -> np.ndarray:
    """Per 128 weights, 64 bytes: low nibble = weight j, high nibble = weight 64 + j."""
    halves = (u & 0x0F).reshape(u.shape[0], -1, 2, 64)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(u.shape[0], -1)


def _high_bit(u: np.ndarray) -> np.ndarray:
    """Bit 4 of each quant, 8 per byte, little-endian: one 64-bit mask per 64 weights."""
    bits = ((u >> 4) & 1).reshape(u.shape[0], -1, 8)
    return np.packbits(bits, axis=-1, bitorder="little").reshape(u.shape[0], -1)


def _high_two_bits(u: np.ndarray) -> np.ndarray:
    """Bits 4-5 of each quant: per 64 weights, byte j holds weight 16k + j at bits 2k..2k+1."""
    pairs = ((u >> 4) & 3).reshape(u.shape[0], -1, 4, 16)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return np.bitwise_or.reduce(pairs << shifts, axis=2).astype(np.uint8).reshape(u.shape[0], -1)


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
    u = _unsigned_quants(weight).to(torch.float32)
    a, b = _group_scales(weight)  # per 16 weights
    values = u.reshape(weight.out_features, -1, 16) * a.unsqueeze(-1) - b.unsqueeze(-1)
    return values.reshape(weight.out_features, -1)[:, : weight.in_features].to(dtype)


def _unsigned_quants(weight: PackedWeight) -> torch.Tensor:
    rows = weight.out_features
    bits = QUANT_BITS[weight.qtype]
    if bits == 8:
        return weight.quants.to(torch.int32)
    packed = weight.quants.to(torch.int32).reshape(rows, -1, 1, 64)
    u = ((packed >> torch.tensor([0, 4], device=packed.device).reshape(1, 1, 2, 1)) & 0x0F).reshape(rows, -1)
    high = weight.high.to(torch.int32)
    if bits == 5:
        bit = (high.unsqueeze(-1) >> torch.arange(8, device=high.device)) & 1
        u = u | (bit.reshape(rows, -1) << 4)
    elif bits == 6:
        pairs = (high.reshape(rows, -1, 1, 16) >> (2 * torch.arange(4, device=high.device)).reshape(1, 1, 4, 1)) & 3
        u = u | (pairs.reshape(rows, -1) << 4)
    return u


def _group_scales(weight: PackedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    d = weight.d.view(torch.float16).to(torch.float32)
    if weight.qtype in SIMPLE_OFFSETS:
        a = d.repeat_interleave(2, dim=1)
        return a, a * SIMPLE_OFFSETS[weight.qtype]
    if weight.qtype == T.Q6_K:
        a = d.repeat_interleave(16, dim=1) * weight.sc.to(torch.float32)
        return a, a * Q6_K_OFFSET
    a = (d.repeat_interleave(8, dim=1) * weight.sc.to(torch.float32)).repeat_interleave(2, dim=1)
    b = (weight.dmin.view(torch.float16).to(torch.float32).repeat_interleave(8, dim=1) * weight.m.to(torch.float32)).repeat_interleave(2, dim=1)
    return a, b
