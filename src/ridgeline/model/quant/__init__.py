"""GGUF block-quantised weights kept quantised in memory: packing, compiled kernels, and the layer that uses them."""

from ridgeline.model.quant.quantized_linear import QuantizedLinear, embedding_rows

__all__ = ["QuantizedLinear", "embedding_rows"]
