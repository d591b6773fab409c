"""Token embedding lookup that reads only the rows it needs, straight from the stored (possibly quantised) matrix."""

import torch
from torch import nn

from ridgeline.model.weights import StoredTensor


class TokenEmbedding(nn.Module):
    def __init__(self, weight: StoredTensor, scale: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = weight
        # Gemma multiplies by sqrt(hidden) in the activation dtype, as its reference implementation does.
        self.scale = torch.tensor(scale, dtype=dtype).item()
        self.dtype, self.device = dtype, device

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.select_rows(token_ids.cpu()).dequantize(self.dtype)
        return rows.to(self.device) * self.scale
