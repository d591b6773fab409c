"""A tensor as stored in a model file: dense, or GGML block-quantised and kept that way until a layer decides."""

import functools
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

DENSE_TYPES = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}
QUANTIZED_TYPES = (
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q3_K,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.IQ4_NL,
    GGMLQuantizationType.IQ4_XS,
    GGMLQuantizationType.MXFP4,
)
SUPPORTED_TYPES = tuple(DENSE_TYPES) + QUANTIZED_TYPES


@dataclass
class StoredTensor:
    """One weight. `shape` is the logical torch shape (out_features first for a matrix).

    Dense tensors hold a torch tensor of that shape. Quantised ones hold the raw GGML blocks as
    uint8 `[rows, bytes_per_row]`: quantisation blocks run along the last (input) dimension, so a
    row of the matrix is a whole number of blocks and rows can be selected or reordered byte-wise.
    """

    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    data: torch.Tensor

    @property
    def is_quantized(self) -> bool:
        return self.qtype not in DENSE_TYPES

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / self.numel

    def byte_parts(self) -> list[torch.Tensor]:
        """The stored bytes, as the pieces they are held in (whose concatenation is `data`)."""
        return [self.data]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if not self.is_quantized:  # a copy: the stored data may be a view of the file's memory map
            return self.data.to(dtype, copy=True)
        values = gguf_dequantize(self.data.numpy(), self.qtype)
        return torch.from_numpy(np.ascontiguousarray(values)).reshape(self.shape).to(dtype)

    def expert(self, index: int) -> "StoredTensor":
        """Expert `index` of a stacked MoE tensor ([experts, out, in] weights, [experts, out] biases), still in the
        stored type: quantised rows are whole blocks, so an expert's slab is a plain slice of the bytes."""
        if self.is_quantized:
            slab = self.data.reshape(self.shape[0], -1, self.data.shape[-1])[index]  # [out, bytes per row]
        else:
            slab = self.data.reshape(self.shape)[index]
        return StoredTensor(self.qtype, tuple(self.shape[1:]), slab)

    def select_rows(self, index: torch.Tensor) -> "StoredTensor":
        """Rows `index` (e.g. a permutation of attention heads), still in the stored type."""
        return StoredTensor(self.qtype, (len(index),) + tuple(self.shape[1:]), self.data[index].contiguous())


def block_geometry(qtype: GGMLQuantizationType) -> tuple[int, int]:
    """(weights per block, bytes per block) of a GGML type."""
    return GGML_QUANT_SIZES[qtype]


class RowStack(StoredTensor):
    """Several stored matrices of one type stacked by output rows (a layer's q/k/v or gate/up), concatenated only
    when something reads `data`. Stored rows are whole quantisation blocks, so rows concatenate byte-wise. A warm
    start finds the packed stack in the cache by naming the parts in order (their places in the model file, or the
    digest of their concatenation) and never builds the copy: ~0.3 s of the default model's start."""

    def __init__(self, parts: list[StoredTensor]):  # (not the dataclass __init__: `data` is computed)
        if len({part.qtype for part in parts}) != 1 or len({tuple(part.shape[1:]) for part in parts}) != 1:
            raise ValueError("stacked rows must share their type and row shape")
        self.parts = parts
        self.qtype = parts[0].qtype
        self.shape = (sum(part.shape[0] for part in parts), *parts[0].shape[1:])

    @functools.cached_property
    def data(self) -> torch.Tensor:  # type: ignore[override]
        return torch.cat([part.data for part in self.parts])

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def byte_parts(self) -> list[torch.Tensor]:
        return [data for part in self.parts for data in part.byte_parts()]
