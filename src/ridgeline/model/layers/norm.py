"""RMSNorm. The stored weight is the full scale (Gemma's 1 + w is folded in by the loaders)."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Normalises the last dim; the weight is [dim], or [heads, dim] for a per-head scale (attention's QK-norm).

    x * rsqrt(mean(x²) + eps) * w is computed as x * rsqrt(sum(x²) + dim * eps) * (w * sqrt(dim)): the same
    value in fewer torch calls (a decode step makes ~90 of these, and each call costs more than its arithmetic;
    torch's rms_norm makes eight, two of them scalar-to-tensor conversions). No fused multiply-add either: its
    vectorised and scalar code paths round differently, which would make a row's bits depend on the batch size.
    """

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        dim = weight.shape[-1]
        self.weight = nn.Parameter(weight.float(), requires_grad=False)
        self.eps = eps
        self.register_buffer("scaled_weight", self.weight * dim**0.5, persistent=False)
        self.register_buffer("scaled_eps", torch.tensor(dim * eps, device=weight.device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # fp32 whatever the activation dtype: bf16 sums of squares lose too much
        inverse_rms = (x32 * x32).sum(-1, keepdim=True).add_(self.scaled_eps).rsqrt_()
        return (x32 * self.scaled_weight).mul_(inverse_rms).to(x.dtype)
