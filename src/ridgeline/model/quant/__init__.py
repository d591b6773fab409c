"""GGUF block-quantised weights kept quantised in memory: packing, compiled kernels, and the layer that uses them."""

from ridgeline.model.quant.quantized_linear import QuantizedLinear

__all__ = ["QuantizedLinear"]
