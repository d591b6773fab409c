"""RMSNorm. The stored weight is the full scale (Gemma's 1 + w is folded in by the loaders)."""

import torch
from torch import nn

from ridgeline.model.native import NO_TENSOR, compiled, on_compiled_path


class RMSNorm(nn.Module):
    """Normalises the last dim with a [dim] weight.

    On the CPU in fp32 it is one call of the compiled kernels. Elsewhere (torch):
    x * rsqrt(mean(x²) + eps) * w is computed as x * rsqrt(sum(x²) + dim * eps) * (w * sqrt(dim)): the same
    value in fewer torch calls (torch's rms_norm makes eight, two of them scalar-to-tensor conversions). No fused
    multiply-add either: its vectorised and scalar code paths round differently, which would make a row's bits
    depend on the batch size.
    """

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        dim = weight.shape[-1]
        self.weight = nn.Parameter(weight.float(), requires_grad=False)
        self.eps = eps
        self.register_buffer("scaled_weight", self.weight * dim**0.5, persistent=False)
        self.register_buffer("scaled_eps", torch.tensor(dim * eps, device=weight.device), persistent=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """norm(x), or residual + norm(x) (a sandwich norm and its residual add in one call)."""
        if on_compiled_path(x, multiple=16):
            return compiled().rms_norm(x.contiguous(), self.weight, self.eps,
                                       NO_TENSOR if residual is None else residual.contiguous())
        x32 = x.float()  # fp32 whatever the activation dtype: bf16 sums of squares lose too much
        inverse_rms = (x32 * x32).sum(-1, keepdim=True).add_(self.scaled_eps).rsqrt_()
        normed = (x32 * self.scaled_weight).mul_(inverse_rms).to(x.dtype)
        return normed if residual is None else residual + normed
