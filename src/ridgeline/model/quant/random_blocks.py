"""Random GGML blocks of any supported type, for kernel tests, microbenchmarks and the crossover probe.

Quants are uniform random bytes (every bit pattern the format allows); the fp16 scale fields are replaced by
small positive values, and MXFP4's e8m0 exponents by ones near 2^-7, so dequantised weights stay in a realistic
range. No quantiser is needed, so every type gets blocks, including those gguf cannot quantise to.
"""

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from ridgeline.model.weights import StoredTensor

FP16_SCALE_FIELDS = {  # byte ranges of each block's fp16 scales (d, and dmin or m where the type has one)
    T.Q8_0: (slice(0, 2),),
    T.Q4_0: (slice(0, 2),),
    T.Q5_0: (slice(0, 2),),
    T.Q4_1: (slice(0, 2), slice(2, 4)),
    T.Q5_1: (slice(0, 2), slice(2, 4)),
    T.IQ4_NL: (slice(0, 2),),
    T.IQ4_XS: (slice(0, 2),),
    T.Q2_K: (slice(80, 82), slice(82, 84)),
    T.Q3_K: (slice(108, 110),),
    T.Q4_K: (slice(0, 2), slice(2, 4)),
    T.Q5_K: (slice(0, 2), slice(2, 4)),
    T.Q6_K: (slice(208, 210),),
    T.MXFP4: (),
}
E8M0_SCALE_BYTES = {T.MXFP4: 0}
# Q4_1/Q5_1 store a block's minimum m (w = d * u + m): set it near -d * (half the quant range), as a quantiser
# would for weights centred on zero, so that dot products cancel as real ones do
MINIMUM_FIELDS = {T.Q4_1: (slice(0, 2), slice(2, 4), 8), T.Q5_1: (slice(0, 2), slice(2, 4), 16)}


def random_stored(qtype: T, shape: tuple[int, int], seed: int = 0) -> StoredTensor:
    rng = np.random.default_rng(seed)
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    rows, columns = shape
    blocks = rng.integers(0, 256, (rows, columns // block_size, block_bytes), dtype=np.uint8)
    for field in FP16_SCALE_FIELDS[qtype]:
        scales = (rng.random(blocks.shape[:2]) * 0.01 + 1e-4).astype(np.float16)
        blocks[..., field] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    if qtype in MINIMUM_FIELDS:
        d_field, m_field, half_range = MINIMUM_FIELDS[qtype]
        d = np.ascontiguousarray(blocks[..., d_field]).view(np.float16).astype(np.float32)
        m = (-d * half_range * rng.uniform(0.8, 1.2, d.shape)).astype(np.float16)
        blocks[..., m_field] = m.view(np.uint8)
    if qtype in E8M0_SCALE_BYTES:
        blocks[..., E8M0_SCALE_BYTES[qtype]] = rng.integers(118, 124, blocks.shape[:2], dtype=np.uint8)
    return StoredTensor(qtype, shape, torch.from_numpy(blocks.reshape(rows, -1)))
