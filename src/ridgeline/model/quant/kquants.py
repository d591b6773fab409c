"""Quantisers for Q4_K and Q6_K, which gguf's Python package reads but cannot write (its quantize() raises for
them). Plain round-to-nearest per sub-block, without llama.cpp's importance-weighted search, laid out exactly as
gguf's dequantisers read the blocks (a round trip through `gguf.quants.dequantize` is the test).

Q4_K: 256 weights = 8 sub-blocks of 32; w = d*sc*q - dmin*m, q in 0..15, sc and m 6-bit, d and dmin f16.
Q6_K: 256 weights = 16 sub-blocks of 16; w = d*sc*q, q in -32..31, sc int8, d f16.
"""

import numpy as np

QK_K = 256


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q4_k(weights: np.ndarray) -> np.ndarray:
    rows = weights.reshape(-1, QK_K).astype(np.float32)
    n = rows.shape[0]
    sub = rows.reshape(n, 8, 32)
    low = np.minimum(sub.min(axis=2), 0.0)  # the offset only ever subtracts
    scale = (sub.max(axis=2) - low) / 15.0
    mins = -low
    d = scale.max(axis=1) / 63.0
    dmin = mins.max(axis=1) / 63.0
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d16[:, None] > 0, np.rint(scale / d16[:, None]), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin16[:, None] > 0, np.rint(mins / dmin16[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = (d16[:, None] * sc)[:, :, None]
        offset = (dmin16[:, None] * mn)[:, :, None]
        q = np.where(step > 0, np.rint((sub + offset) / step), 0).clip(0, 15).astype(np.uint8)
    packed_scales = np.empty((n, 12), np.uint8)
    packed_scales[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    packed_scales[:, 4:8] = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    packed_scales[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    pairs = q.reshape(n, 4, 2, 32)  # byte group g holds sub-block 2g (low nibble) and 2g+1 (high)
    qs = (pairs[:, :, 0, :] | (pairs[:, :, 1, :] << 4)).reshape(n, 128)
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed_scales, qs], axis=1)
    return blocks.reshape(*weights.shape[:-1], weights.shape[-1] // QK_K * 144)


def quantize_q6_k(weights: np.ndarray) -> np.ndarray:
    rows = weights.reshape(-1, QK_K).astype(np.float32)
    n = rows.shape[0]
    sub = rows.reshape(n, 16, 16)
    scale = np.abs(sub).max(axis=2) / 31.0
    d = scale.max(axis=1) / 127.0
    d16 = d.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d16[:, None] > 0, np.rint(scale / d16[:, None]), 0).clip(0, 127).astype(np.int8)
        step = (d16[:, None] * sc)[:, :, None]
        q = np.where(step > 0, np.rint(sub / step), 0).clip(-32, 31).astype(np.int16)
    u = (q + 32).astype(np.uint8).reshape(n, 2, 4, 32)  # value v = h*128 + r*32 + l
    low, high = u & 0x0F, u >> 4
    ql = np.empty((n, 2, 2, 32), np.uint8)  # byte h*64 + k*32 + l: chunk r=k low nibble, chunk r=k+2 high nibble
    ql[:, :, 0, :] = low[:, :, 0, :] | (low[:, :, 2, :] << 4)
    ql[:, :, 1, :] = low[:, :, 1, :] | (low[:, :, 3, :] << 4)
    qh = high[:, :, 0, :] | (high[:, :, 1, :] << 2) | (high[:, :, 2, :] << 4) | (high[:, :, 3, :] << 6)
    blocks = np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), _f16_bytes(d)], axis=1)
    return blocks.reshape(*weights.shape[:-1], weights.shape[-1] // QK_K * 210)
