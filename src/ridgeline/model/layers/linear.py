"""The linear-layer interface every matmul in the model goes through: y = x Wᵀ (+ b) from a stored weight.

How a weight is held is the model's `weights` option: "quantized" keeps GGUF blocks quantised in memory and runs
the phase-aware kernels (model/quant); "bf16" and "f32" dequantise once at load (the reference and comparison paths).
"""

import torch
from torch import nn

from ridgeline.model.quant import QuantizedLinear
from ridgeline.model.weights import StoredTensor

WEIGHT_FORMATS = {"quantized": None, "bf16": torch.bfloat16, "f32": torch.float32}


class DenseLinear(nn.Module):
    """Weights dequantised once to a dense dtype; activations are cast to it and back."""

    def __init__(self, weight: StoredTensor, bias: StoredTensor | None, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = nn.Parameter(weight.dequantize(dtype).to(device), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.dequantize(dtype).to(device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


def make_linear(weight: StoredTensor, bias: StoredTensor | None, weights: str, device: torch.device) -> nn.Module:
    if weights == "quantized" and weight.is_quantized:
        return QuantizedLinear.from_stored(weight, None if bias is None else bias.dequantize(), device)
    dense_dtype = WEIGHT_FORMATS[weights] or torch.float32  # a dense stored tensor under "quantized": keep f32
    return DenseLinear(weight, bias, dense_dtype, device)
