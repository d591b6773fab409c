"""The quantised-weight kernels (csrc/quant_kernels.cpp), with a torch fallback (dequantise, then matmul)."""

import torch

from ridgeline.model.native import compiled
from ridgeline.model.quant.packing import PackedWeight, dequantize_reference


def uses_compiled_kernels(weight: PackedWeight) -> bool:
    return weight.quants.device.type == "cpu" and compiled() is not None


def gemv(weight: PackedWeight, x: torch.Tensor) -> torch.Tensor:
    """Memory-bound path: x [M, in] float32 -> [M, out] float32, weights streamed once, activations int8."""
    if not uses_compiled_kernels(weight):
        return x @ dequantize_reference(weight, x.dtype).T
    return compiled().gemv(int(weight.qtype), x, *weight.planes, weight.out_features)


def dequantize(weight: PackedWeight, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `rows` (default: all) of the weight as a dense [len(rows), in] tensor of `dtype`."""
    if not uses_compiled_kernels(weight) or dtype not in (torch.float32, torch.bfloat16):
        dense = dequantize_reference(weight, dtype)
        return dense if rows is None else dense[rows]
    index = torch.empty(0, dtype=torch.int64) if rows is None else rows.to(torch.int64)
    return compiled().dequantize(
        int(weight.qtype), *weight.planes, weight.out_features, weight.in_features, index, dtype == torch.bfloat16
    )
