"""The linear-layer interface every matmul in the model goes through: y = x Wᵀ (+ b) from a stored weight.

How a weight is held is the model's `weights` option: "quantized" keeps GGUF blocks quantised in memory and runs
the phase-aware kernels (model/quant); "bf16" and "f32" dequantise once at load (the reference and comparison paths).

A quantised matmul has two paths, the seed's two phases made into code: rows of generated tokens (decode) take the
memory-bound one (stream the quantised bytes once, int8 dot products), rows of prompt tokens (prefill) the path
this machine measured fastest for prefill-sized chunks (QuantizedLinear.prompt_uses_gemm). The path follows what a row
*is*, never how many rows share the step: both paths give each row the same bits whatever the row count, so a
request's tokens do not depend on its batch.
"""

import torch
from torch import nn

from ridgeline.model.quant import QuantizedLinear
from ridgeline.model.row_paths import RowPaths
from ridgeline.model.weights import StoredTensor

WEIGHT_FORMATS = {"quantized": None, "bf16": torch.bfloat16, "f32": torch.float32}


class DenseLinear(nn.Module):
    """Weights dequantised once to a dense dtype; activations are cast to it and back."""

    def __init__(self, weight: StoredTensor, bias: StoredTensor | None, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = nn.Parameter(weight.dequantize(dtype).to(device), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.dequantize(dtype).to(device), requires_grad=False)

    def forward(self, x: torch.Tensor, paths: RowPaths) -> torch.Tensor:
        return nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


class PhaseAwareLinear(nn.Module):
    """A QuantizedLinear driven by RowPaths instead of by row count."""

    def __init__(self, quantized: QuantizedLinear):
        super().__init__()
        self.quantized = quantized

    def forward(self, x: torch.Tensor, paths: RowPaths) -> torch.Tensor:
        layer = self.quantized
        if not layer.prompt_uses_gemm:  # both kinds of row take the int8 kernel: no need to split them
            return layer.memory_bound(x)
        if paths.compute_rows is None:
            return layer.compute_bound(x) if paths.all_compute else layer.memory_bound(x)
        out = x.new_empty(x.shape[0], layer.out_features)
        out[paths.compute_rows] = layer.compute_bound(x[paths.compute_rows])
        out[paths.memory_rows] = layer.memory_bound(x[paths.memory_rows])
        return out


def make_linear(weight: StoredTensor, bias: StoredTensor | None, weights: str, device: torch.device) -> nn.Module:
    if weights == "quantized" and weight.is_quantized:
        return PhaseAwareLinear(QuantizedLinear.from_stored(weight, None if bias is None else bias.dequantize(), device))
    dense_dtype = WEIGHT_FORMATS[weights] or torch.float32  # a dense stored tensor under "quantized": keep f32
    return DenseLinear(weight, bias, dense_dtype, device)
