"""The linear-layer interface every matmul in the model goes through: y = x Wᵀ (+ b) from a stored weight."""

import torch
from torch import nn

from ridgeline.model.weights import StoredTensor


class DenseLinear(nn.Module):
    """Weights dequantised once to the compute dtype (the f32/bf16 reference path)."""

    def __init__(self, weight: StoredTensor, bias: StoredTensor | None, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = nn.Parameter(weight.dequantize(dtype).to(device), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.dequantize(dtype).to(device), requires_grad=False)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


def make_linear(weight: StoredTensor, bias: StoredTensor | None, dtype: torch.dtype, device: torch.device) -> nn.Module:
    return DenseLinear(weight, bias, dtype, device)
