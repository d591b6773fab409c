"""Gated feed-forward: down(act(gate(x)) * up(x)); SiLU for the llama family, tanh-GELU for Gemma."""

import torch
from torch import nn

from ridgeline.model.layers.linear import RowPaths

ACTIVATIONS = {
    "silu": nn.functional.silu,
    "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
}


class GatedMLP(nn.Module):
    def __init__(self, gate: nn.Module, up: nn.Module, down: nn.Module, activation: str):
        super().__init__()
        self.gate, self.up, self.down = gate, up, down
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor, paths: RowPaths) -> torch.Tensor:
        return self.down(self.activation(self.gate(x, paths)) * self.up(x, paths), paths)
