"""RMSNorm. The stored weight is the full scale (Gemma's 1 + w is folded in by the loaders)."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Normalises the last dim; the weight is [dim], or [heads, dim] for a per-head scale (attention's QK-norm)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.float(), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the activation dtype (bf16 sums of squares lose too much); torch's fused
        # kernel, because the decode step calls this ~90 times and per-call overhead adds up.
        normed = nn.functional.rms_norm(x.float(), x.shape[-1:], eps=self.eps) * self.weight
        return normed.to(x.dtype)
