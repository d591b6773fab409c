"""Projections of one input (attention's q/k/v, the MLP's gate/up) in as few matmuls as their storage allows.

Weights stored in the same format are concatenated by output rows into one matrix, so a step quantises the input
once and makes one kernel call for them instead of one each (a batch-1 decode step makes ~130 linear calls, and
each costs more than its arithmetic). A row's output is computed exactly as it was in its own matrix.
"""

import torch
from gguf import GGMLQuantizationType
from torch import nn

from ridgeline.model.layers.linear import make_linear
from ridgeline.model.row_paths import RowPaths
from ridgeline.model.weights import RowStack, StoredTensor


class SharedInputLinear(nn.Module):
    def __init__(self, weights: list[StoredTensor], biases: list[StoredTensor | None], weights_format: str,
                 device: torch.device):
        super().__init__()
        by_format: dict[GGMLQuantizationType, list[int]] = {}
        for index, weight in enumerate(weights):
            by_format.setdefault(weight.qtype, []).append(index)
        self.linears = nn.ModuleList()
        self.outputs: list[tuple[int, int, int]] = [(0, 0, 0)] * len(weights)  # (linear, first row, end row)
        for members in by_format.values():
            start = 0
            for index in members:
                self.outputs[index] = (len(self.linears), start, start + weights[index].shape[0])
                start += weights[index].shape[0]
            self.linears.append(make_linear(_stack_rows([weights[i] for i in members]),
                                            _stack_biases([weights[i] for i in members], [biases[i] for i in members]),
                                            weights_format, device))

    def forward(self, x: torch.Tensor, paths: RowPaths) -> list[torch.Tensor]:
        """Each projection's [T, out] output (column slices of the shared results), in the order given."""
        results = [linear(x, paths) for linear in self.linears]
        return [results[linear][:, first:end] for linear, first, end in self.outputs]


def _stack_rows(weights: list[StoredTensor]) -> StoredTensor:
    return weights[0] if len(weights) == 1 else RowStack(weights)


def _stack_biases(weights: list[StoredTensor], biases: list[StoredTensor | None]) -> StoredTensor | None:
    if all(b is None for b in biases):
        return None
    parts = [torch.zeros(w.shape[0]) if b is None else b.dequantize() for w, b in zip(weights, biases)]
    values = torch.cat(parts)
    return StoredTensor(GGMLQuantizationType.F32, tuple(values.shape), values)
