"""Random GGML blocks of any supported type, for kernel tests, microbenchmarks and the crossover probe.

Quants are uniform random bytes (every bit pattern the format allows); the fp16 scale fields are replaced by
small positive values so dequantised weights stay in a realistic range.
"""

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from ridgeline.model.weights import StoredTensor

FP16_SCALE_FIELDS = {  # byte ranges of each block's fp16 scales (d, and dmin for Q4_K/Q5_K)
    T.Q8_0: (slice(0, 2),),
    T.Q4_0: (slice(0, 2),),
    T.Q5_0: (slice(0, 2),),
    T.Q4_K: (slice(0, 2), slice(2, 4)),
    T.Q5_K: (slice(0, 2), slice(2, 4)),
    T.Q6_K: (slice(208, 210),),
}


def random_stored(qtype: T, shape: tuple[int, int], seed: int = 0) -> StoredTensor:
    rng = np.random.default_rng(seed)
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    rows, columns = shape
    blocks = rng.integers(0, 256, (rows, columns // block_size, block_bytes), dtype=np.uint8)
    for field in FP16_SCALE_FIELDS[qtype]:
        scales = (rng.random(blocks.shape[:2]) * 0.01 + 1e-4).astype(np.float16)
        blocks[..., field] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return StoredTensor(qtype, shape, torch.from_numpy(blocks.reshape(rows, -1)))
