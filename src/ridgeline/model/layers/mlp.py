"""Gated feed-forward: down(act(gate(x)) * up(x)); SiLU for the llama family, tanh-GELU for Gemma."""

import torch
from torch import nn

from ridgeline.model.layers.shared_input import SharedInputLinear
from ridgeline.model.native import compiled, on_compiled_path
from ridgeline.model.row_paths import RowPaths

ACTIVATIONS = {
    "silu": nn.functional.silu,
    "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
}


class GatedMLP(nn.Module):
    def __init__(self, gate_up: SharedInputLinear, down: nn.Module, activation: str):
        super().__init__()
        self.gate_up, self.down = gate_up, down
        self.activation, self.gelu = activation, activation == "gelu_tanh"

    def forward(self, x: torch.Tensor, paths: RowPaths) -> torch.Tensor:
        gate, up = self.gate_up(x, paths)
        if on_compiled_path(gate, multiple=16):
            mixed = compiled().gated_activation(gate, up, self.gelu)
        else:
            mixed = ACTIVATIONS[self.activation](gate) * up
        return self.down(mixed, paths)
