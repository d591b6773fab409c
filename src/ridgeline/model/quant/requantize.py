"""Requantising the LM head: a measured speed/accuracy trade the user opts into (`--lm-head q4|q8|keep`).

A decode step reads the whole LM head (the default model's is 178 MB of Q8_0, 73% of its bytes), so a 4-bit
head makes every token cheaper at some cost in accuracy; `ridgeline bench latency --lm-head q4` and
`ridgeline perplexity --lm-head q4` measure both sides. gguf's own quantisers make the blocks.
"""

import torch
from gguf import GGMLQuantizationType, quants

from ridgeline.model.weights import StoredTensor

LM_HEAD_FORMATS = {"keep": None, "q8": GGMLQuantizationType.Q8_0, "q4": GGMLQuantizationType.Q4_0}


def requantize(weight: StoredTensor, qtype: GGMLQuantizationType) -> StoredTensor:
    """The weight dequantised to f32 and quantised again as `qtype` (blocks along the input dimension)."""
    if weight.qtype == qtype:
        return weight
    blocks = quants.quantize(weight.dequantize(torch.float32).numpy(), qtype)
    return StoredTensor(qtype, weight.shape, torch.from_numpy(blocks))
