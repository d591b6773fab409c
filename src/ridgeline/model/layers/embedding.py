"""Token embedding lookup that dequantises only the rows it needs.

A tied embedding reads its rows from the LM head's packed weight (the compiled kernels dequantise selected rows
exactly as gguf does), so the model holds the matrix once and keeps no reference into the GGUF file's memory
map. Otherwise the rows come straight from the stored (possibly quantised) matrix.
"""

import torch
from torch import nn

from ridgeline.model.quant import QuantizedLinear
from ridgeline.model.weights import StoredTensor


class TokenEmbedding(nn.Module):
    def __init__(self, source: StoredTensor | QuantizedLinear, scale: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.source = source
        # Gemma multiplies by sqrt(hidden) in the activation dtype, as its reference implementation does.
        self.scale = torch.tensor(scale, dtype=dtype).item()
        self.dtype, self.device = dtype, device

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.source, QuantizedLinear):
            rows = self.source.rows(token_ids.to(self.source.quants.device), self.dtype)
        else:
            rows = self.source.select_rows(token_ids.cpu()).dequantize(self.dtype)
        return rows.to(self.device) * self.scale
