"""RMSNorm. The stored weight is the full scale (Gemma's 1 + w is folded in by the loaders)."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.float(), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the activation dtype (bf16 sums of squares lose too much); torch's fused
        # kernel, because the decode step calls this ~110 times and per-call overhead adds up.
        normed = nn.functional.rms_norm(x.float(), self.weight.shape, self.weight, self.eps)
        return normed.to(x.dtype)
