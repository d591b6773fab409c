"""Gated feed-forward: down(act(gate(x)) * up(x)); SiLU for the llama family, tanh-GELU for Gemma, and gpt-oss's
clamped SwiGLU, (clamp(up) + 1) * g * sigmoid(alpha * g) with g = gate clamped from above, for its experts."""

import functools

import torch
from torch import nn

from ridgeline.model.layers.shared_input import SharedInputLinear
from ridgeline.model.native import compiled, on_compiled_path
from ridgeline.model.row_paths import RowPaths



def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


ACTIVATIONS = {
    "silu": nn.functional.silu,
    "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
}
COMPILED = ("silu", "gelu_tanh")  # the activations csrc/layer_ops.cpp implements


class GatedMLP(nn.Module):
    def __init__(self, gate_up: SharedInputLinear, down: nn.Module, activation: str,
                 swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0):
        super().__init__()
        self.gate_up, self.down = gate_up, down
        self.activation, self.gelu = activation, activation == "gelu_tanh"
        if activation == "swiglu_oai":
            self.gated = functools.partial(clamped_swiglu, alpha=swiglu_alpha, limit=swiglu_limit)
        else:
            self.gated = lambda gate, up: ACTIVATIONS[activation](gate) * up

    def forward(self, x: torch.Tensor, paths: RowPaths) -> torch.Tensor:
        gate, up = self.gate_up(x, paths)
        if self.activation in COMPILED and on_compiled_path(gate, multiple=16):
            mixed = compiled().gated_activation(gate, up, self.gelu)
        else:
            mixed = self.gated(gate, up)
        return self.down(mixed, paths)
