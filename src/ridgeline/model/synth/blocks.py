"""Random GGML blocks written straight from random bytes (no float matrix, no quantiser), scaled so that the
dequantised weights have a chosen standard deviation and a mean near zero, as a trained layer's do.

quant/random_blocks.py makes blocks for kernel tests, where any value will do. A whole synthetic model needs more:
forty layers of weights whose means do not cancel would blow the residual stream up. So each type's blocks are
built centred: Q8_0's and MXFP4's codes are symmetric already; Q4_K's offset is set to the middle of each
sub-block's range (m = sc and dmin = 7.5 d, so w = d * sc * (q - 7.5)); Q4_0's and Q6_K's codes sit half a step
below zero, and their scales take random signs (as a quantiser's do), which cancels that across blocks.

How far one unit of scale spreads a type's weights is measured once per type by gguf's own dequantiser on a
sample, so no per-type constant is written down here to go stale.
"""

import functools

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

BLOCK_TYPES = (T.Q8_0, T.Q4_0, T.Q4_K, T.Q6_K, T.MXFP4)
FLOAT_TYPES = (T.F32, T.F16)


def _f16_field(blocks: np.ndarray, start: int, values: np.ndarray) -> None:
    blocks[:, start:start + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _jitter(rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-block scale variation, as real blocks' scales vary with their largest weight."""
    return rng.uniform(0.8, 1.2, n).astype(np.float32)


def _build(qtype: T, n: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    """`n` blocks of `qtype` as uint8 [n, block_bytes], every quant a random byte, scales around `scale`."""
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    blocks = np.frombuffer(rng.bytes(n * block_bytes), np.uint8).reshape(n, block_bytes).copy()
    if qtype in (T.Q8_0, T.Q4_0):  # d, then the codes (int8 for Q8_0; nibbles - 8 for Q4_0)
        # d's sign at random, as llama.cpp's quantiser leaves it (d = the signed largest weight / -8): Q4_0's
        # codes centre half a step below zero, and the signs cancel that across blocks
        _f16_field(blocks, 0, scale * _jitter(rng, n) * rng.choice(np.array([-1, 1], np.float32), n))
    elif qtype == T.Q4_K:  # d, dmin, 12 bytes of 6-bit (sc, m) pairs for 8 sub-blocks, 128 bytes of nibbles
        d = (scale * _jitter(rng, n)).astype(np.float16)
        _f16_field(blocks, 0, d)
        _f16_field(blocks, 2, d.astype(np.float32) * 7.5)
        v = rng.integers(32, 64, n, dtype=np.uint8)[:, None]  # one sc = m for the block's 8 sub-blocks
        six_bits = (v & 0x3F) | ((v >> 4) << 6)  # bytes 0-3 (sc 0-3) and 4-7 (m 0-3), top bits: sc/m 4-7's high
        blocks[:, 4:12] = six_bits
        blocks[:, 12:16] = (v & 0x0F) | ((v & 0x0F) << 4)  # sc 4-7 (low nibble) and m 4-7 (high): low 4 bits
    elif qtype == T.Q6_K:  # 128 bytes low nibbles, 64 bytes high pairs, 16 int8 sub-block scales, d
        magnitude = rng.integers(16, 128, (n, 16)).astype(np.int16)
        blocks[:, 192:208] = (magnitude * rng.choice(np.array([-1, 1], np.int16), (n, 16))).astype(np.int8).view(np.uint8)
        _f16_field(blocks, 208, scale * _jitter(rng, n))
    elif qtype == T.MXFP4:  # one E8M0 exponent, 16 bytes of FP4 (E2M1) pairs: the exponent is a power of two
        exponent = 127 + int(round(np.log2(scale)))
        blocks[:, 0] = np.clip(exponent + rng.integers(-1, 2, n), 1, 254).astype(np.uint8)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return blocks


@functools.cache
def unit_std(qtype: T) -> float:
    """The standard deviation of dequantised weights built at scale 1 (measured on 2,048 blocks)."""
    sample = _build(qtype, 2048, 1.0, np.random.default_rng(0))
    return float(dequantize(sample, qtype).std())


def random_rows(qtype: T, rows: int, columns: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """`rows` rows of `columns` weights of standard deviation ~`std`: uint8 [rows, bytes per row] for block types,
    the float array itself for F32/F16."""
    if qtype in FLOAT_TYPES:
        values = rng.standard_normal((rows, columns), dtype=np.float32) * np.float32(std)
        return values.astype(np.float16) if qtype == T.F16 else values
    block_size = GGML_QUANT_SIZES[qtype][0]
    if columns % block_size:
        raise ValueError(f"rows of {columns} do not split into {qtype.name} blocks of {block_size}")
    blocks = _build(qtype, rows * (columns // block_size), std / unit_std(qtype), rng)
    return blocks.reshape(rows, -1)
