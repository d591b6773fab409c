"""Repack GGML blocks, once at load, into planes the kernels can stream: unsigned quants + per-group scales.

Every supported type becomes `w = a * (u - offset) - b` with u an unsigned integer of 2 to 8 bits and (a, b)
constant over a group of 32 weights (16 for Q6_K, Q2_K, Q3_K). The non-linear types (IQ4_NL, IQ4_XS, MXFP4)
store a 4-bit index whose value comes from a 16-entry int8 codebook; the kernels look it up as they decode
(u = codebook + 128), so memory holds the nibble. Output rows are interleaved in blocks of 16, four input weights
at a time, so that one int8 dot-product instruction serves 16 rows (csrc/quant_kernels.cpp documents the byte
layout). The planes take the same bytes as the file, except where packed sub-block scales are unpacked to a byte
each (Q4_K/Q5_K/Q3_K +0.125 bits per weight, IQ4_XS +0.0625). Row counts that are not a multiple of 16
are padded with zero rows (real models never need it; tests do).
"""

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import IQ4_NL, MXFP4, Q4_K

from ridgeline.errors import UnsupportedError
from ridgeline.model.weights import StoredTensor, block_geometry

BLOCK_ROWS = 16  # output rows interleaved per block
# Bits of u as stored: 8 as bytes; 4 to 6 as a nibble plus bit planes; 2 and 3 as a 2-bit field plus a bit plane.
QUANT_BITS = {
    T.Q8_0: 8, T.Q4_0: 4, T.Q5_0: 5, T.Q4_1: 4, T.Q5_1: 5, T.Q4_K: 4, T.Q5_K: 5, T.Q6_K: 6,
    T.Q2_K: 2, T.Q3_K: 3, T.IQ4_NL: 4, T.IQ4_XS: 4, T.MXFP4: 4,
}  # fmt: skip
# w = a * (u - offset): the offset centres u on zero (types with a separate minimum have none).
OFFSETS = {T.Q8_0: 128, T.Q4_0: 8, T.Q5_0: 16, T.Q6_K: 32, T.Q3_K: 4, T.IQ4_NL: 128, T.IQ4_XS: 128, T.MXFP4: 128}
# 4-bit index -> u: the int8 codebook shifted to unsigned, so the int8 kernel's u8 x s8 products apply unchanged.
CODEBOOKS = {
    T.IQ4_NL: np.array(IQ4_NL.kvalues, dtype=np.int16) + 128,
    T.IQ4_XS: np.array(IQ4_NL.kvalues, dtype=np.int16) + 128,
    T.MXFP4: np.array(MXFP4.kvalues, dtype=np.int16) + 128,
}
GROUP_SIZE = {T.Q6_K: 16, T.Q2_K: 16, T.Q3_K: 16}  # weights under one (a, b); 32 for every other type


def low_bits(qtype: T) -> int:
    """Bits of u held in the `quants` plane; the rest, one mask per bit, in `high`."""
    bits = QUANT_BITS[qtype]
    return 8 if bits == 8 else 4 if bits >= 4 else 2


@dataclass
class PackedWeight:
    """One [out_features, in_features] weight matrix in kernel layout, one plane row per block of 16 output rows.

    Empty planes are zero-size tensors.
    """

    qtype: T
    out_features: int
    in_features: int
    quants: torch.Tensor  # uint8 [blocks, 16 * in] (8-bit), [blocks, 8 * in] (nibbles) or [blocks, 4 * in] (2-bit)
    high: torch.Tensor  # uint8 [blocks, 2 * in] per bit above the low ones: one 64-bit mask per step and bit
    # fp16 scales held as their int16 bit patterns, so a model-wide .float() / .to(dtype) leaves them alone
    d: torch.Tensor  # [blocks, 16 * groups] (Q8_0/Q4_0/Q5_0/Q4_1/Q5_1/IQ4_NL) or [blocks, 16 * super-blocks of 256]
    dmin: torch.Tensor  # [blocks, 16 * super-blocks] (Q4_K/Q5_K/Q2_K) or [blocks, 16 * groups] (Q4_1/Q5_1: the m)
    # per group: uint8 (Q4_K/Q5_K; Q2_K: sc | m << 4 as stored; MXFP4: the e8m0 exponent) or int8 (Q6_K/Q3_K/IQ4_XS)
    sc: torch.Tensor
    m: torch.Tensor  # uint8 [blocks, 16 * groups] (Q4_K/Q5_K)

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
    low = low_bits(weight.qtype)
    if low == 8:
        quants = steps
    else:  # 8 / low consecutive steps share 64 bytes, the first in the lowest bits
        fields = (steps & ((1 << low) - 1)).reshape(steps.shape[0], -1, 8 // low, 64)
        quants = np.bitwise_or.reduce(fields << (low * np.arange(8 // low, dtype=np.uint8)).reshape(1, 1, -1, 1), axis=2)
    high_bits = tuple(range(low, QUANT_BITS[weight.qtype]))
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


def _bits_of_u32(raw: np.ndarray) -> np.ndarray:
    """4 bytes per block -> its 32 bits, least significant first."""
    qh = np.ascontiguousarray(raw).view(np.uint32)
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _unpack_q5_0(blocks):
    u = _low_high_nibbles(blocks[..., 6:], 16) | (_bits_of_u32(blocks[..., 2:6]) << 4)
    return u.reshape(blocks.shape[0], -1), {"d": _fp16(blocks[..., 0:2])}


def _unpack_q4_1(blocks):  # w = d * u + m: a = d, b = -m
    u = _low_high_nibbles(blocks[..., 4:], 16)
    return u.reshape(blocks.shape[0], -1), {"d": _fp16(blocks[..., 0:2]), "dmin": _fp16(blocks[..., 2:4])}


def _unpack_q5_1(blocks):
    u = _low_high_nibbles(blocks[..., 8:], 16) | (_bits_of_u32(blocks[..., 4:8]) << 4)
    return u.reshape(blocks.shape[0], -1), {"d": _fp16(blocks[..., 0:2]), "dmin": _fp16(blocks[..., 2:4])}


def _unpack_iq4_nl(blocks):  # u is the codebook index; the kernels look the value up
    u = _low_high_nibbles(blocks[..., 2:], 16)
    return u.reshape(blocks.shape[0], -1), {"d": _fp16(blocks[..., 0:2])}


def _unpack_iq4_xs(blocks):
    n, supers, _ = blocks.shape
    u = _low_high_nibbles(blocks[..., 8:], 16)  # 8 groups of 32, each 16 bytes: j (low), 16 + j (high)
    scales_h = np.ascontiguousarray(blocks[..., 2:4]).view(np.uint16)  # 2 bits per group
    high = (scales_h >> (2 * np.arange(8, dtype=np.uint16))) & 3
    low = _low_high_nibbles(blocks[..., 4:8].reshape(n, supers, 4), 1).reshape(n, supers, 8)  # group 2i low, 2i+1 high
    sc = (low | (high.astype(np.uint8) << 4)).astype(np.int8) - np.int8(32)
    return u.reshape(n, -1), {"d": _fp16(blocks[..., 0:2]), "sc": sc.reshape(n, supers * 8)}


def _unpack_mxfp4(blocks):  # the shared scale stays an e8m0 exponent byte; the kernels make it 2^(e - 128)
    u = _low_high_nibbles(blocks[..., 1:], 16)
    return u.reshape(blocks.shape[0], -1), {"sc": np.ascontiguousarray(blocks[..., 0])}


def _two_bit_fields(qs: np.ndarray) -> np.ndarray:
    """K-quants' 2-bit order: each run of 32 bytes holds weights j, 32 + j, 64 + j, 96 + j (bits 0-1 ... 6-7)."""
    n, supers, size = qs.shape
    fields = qs.reshape(n, supers, size // 32, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    return (fields & 3).reshape(n, supers, 4 * size)


def _unpack_q2_k(blocks):
    n, supers, _ = blocks.shape
    u = _two_bit_fields(blocks[..., 16:80])
    scales = np.ascontiguousarray(blocks[..., 0:16]).reshape(n, supers * 16)  # kept as is: sc low nibble, m high
    return u.reshape(n, -1), {"d": _fp16(blocks[..., 80:82]), "dmin": _fp16(blocks[..., 82:84]), "sc": scales}


def _unpack_q3_k(blocks):  # w = d * sc * (u - 4) with u = 2 low bits + 4 * (hmask bit)
    n, supers, _ = blocks.shape
    low = _two_bit_fields(blocks[..., 32:96])
    hmask = blocks[..., 0:32]  # bit i of byte j: weight 32 i + j
    high = (hmask[:, :, None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    u = low | (high.reshape(low.shape) << 2)
    packed = blocks[..., 96:108]  # 16 scales of 6 bits: low nibbles in bytes 0-7, 2-bit tops in bytes 8-11
    low_nibbles = _low_high_nibbles(packed[..., 0:8], 8)
    tops = (packed[..., 8:12, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3  # [n, supers, 4 bytes, 4]
    tops = tops.transpose(0, 1, 3, 2).reshape(n, supers, 16)
    sc = (low_nibbles | (tops << 4)).astype(np.int8) - np.int8(32)
    return u.reshape(n, -1), {"d": _fp16(blocks[..., 108:110]), "sc": sc.reshape(n, supers * 16)}


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
    T.Q4_1: _unpack_q4_1,
    T.Q5_1: _unpack_q5_1,
    T.IQ4_NL: _unpack_iq4_nl,
    T.IQ4_XS: _unpack_iq4_xs,
    T.MXFP4: _unpack_mxfp4,
    T.Q2_K: _unpack_q2_k,
    T.Q3_K: _unpack_q3_k,
    T.Q4_K: _unpack_q4_k,
    T.Q5_K: _unpack_q5_k,
    T.Q6_K: _unpack_q6_k,
}


def dequantize_reference(weight: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The packed weight as a dense [out, in] tensor with torch ops only: the portable (any device) path."""
    rows = weight.out_features
    u = _unsigned_quants(weight).to(torch.float32)  # [blocks * 16, in]
    a, b = _group_scales(weight)  # [blocks * 16, groups]
    # (u - offset) first: exact in float32, so a * (u - offset) rounds once, as gguf's d * q does
    centred = u - OFFSETS.get(weight.qtype, 0)
    values = centred.reshape(u.shape[0], a.shape[1], -1) * a.unsqueeze(-1) - b.unsqueeze(-1)
    return values.reshape(u.shape[0], -1)[:rows].to(dtype)


def _deinterleave(steps: torch.Tensor) -> torch.Tensor:
    """[blocks, steps, 64] -> [blocks * 16, steps * 4]."""
    blocks = steps.shape[0]
    return steps.reshape(blocks, -1, BLOCK_ROWS, 4).permute(0, 2, 1, 3).reshape(blocks * BLOCK_ROWS, -1)


def _unsigned_quants(weight: PackedWeight) -> torch.Tensor:
    blocks = weight.quants.shape[0]
    low = low_bits(weight.qtype)
    packed = weight.quants.to(torch.int32).reshape(blocks, -1, 1, 64)
    if low == 8:
        return _deinterleave(packed.reshape(blocks, -1, 64))
    shifts = torch.arange(0, 8, low, device=packed.device).reshape(1, 1, -1, 1)
    steps = ((packed >> shifts) & ((1 << low) - 1)).reshape(blocks, -1, 64)
    extra = QUANT_BITS[weight.qtype] - low
    if extra:
        masks = weight.high.to(torch.int32).reshape(blocks, steps.shape[1], extra, 8, 1)
        bit_values = (masks >> torch.arange(8, device=masks.device)) & 1  # [blocks, steps, bits, 8, 8]
        for i in range(extra):
            steps = steps | (bit_values[:, :, i].reshape(blocks, -1, 64) << (low + i))
    if weight.qtype in CODEBOOKS:
        steps = torch.from_numpy(CODEBOOKS[weight.qtype]).to(torch.int32).to(steps.device)[steps]
    return _deinterleave(steps)


def _group_scales(weight: PackedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row and group of weights: a and b of w = a * (u - offset) - b."""
    def rows(plane: torch.Tensor) -> torch.Tensor:  # [blocks, groups * 16] -> [blocks * 16, groups]
        blocks = plane.shape[0]
        return plane.reshape(blocks, -1, BLOCK_ROWS).permute(0, 2, 1).reshape(blocks * BLOCK_ROWS, -1)

    def fp16(plane: torch.Tensor) -> torch.Tensor:
        return rows(plane).view(torch.float16).to(torch.float32)

    qtype = weight.qtype
    if qtype == T.MXFP4:  # e8m0: 2^(e - 128), ggml's "half" of the OCP scale (its codebook is doubled)
        exponent = rows(weight.sc).to(torch.int32) - 128
        return torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent), torch.zeros(())
    if weight.sc.numel() == 0:  # one fp16 d per group (Q4_1/Q5_1: and m, the group's minimum)
        d = fp16(weight.d)
        return d, -fp16(weight.dmin) if weight.dmin.numel() else torch.zeros(())
    per_super = 256 // GROUP_SIZE.get(qtype, 32)
    sc, m = rows(weight.sc), rows(weight.m) if weight.m.numel() else None
    if qtype == T.Q2_K:
        sc, m = sc & 0x0F, sc >> 4
    a = fp16(weight.d).repeat_interleave(per_super, dim=1) * sc.to(torch.float32)
    if m is None:
        return a, torch.zeros(())
    b = fp16(weight.dmin).repeat_interleave(per_super, dim=1) * m.to(torch.float32)
    return a, b
