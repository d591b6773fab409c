"""Mixture-of-experts tensors of a Hugging Face checkpoint, in the layout GGUF gives them.

GGUF keeps each layer's experts as one 3-D tensor per projection, [experts, out_features, in_features]
(`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`, biases [experts, out_features]), and the router as
`ffn_gate_inp`. Hugging Face checkpoints come in two layouts, both read here:
- one matrix per expert (Qwen3-MoE: `mlp.experts.{e}.gate_proj.weight`), stacked once all are read;
- fused 3-D parameters (gpt-oss: `mlp.experts.gate_up_proj` [experts, in, 2 x out] with gate and up
  interleaved column by column, `down_proj` [experts, in, out]), split and transposed.
"""

import re

import torch

from ridgeline.errors import UnsupportedError

PER_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
PROJECTIONS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
ROUTERS = {"mlp.gate": "ffn_gate_inp", "mlp.router": "ffn_gate_inp"}


class ExpertTensors:
    """Collects one layer's expert tensors as they are read; `finish` yields them under GGUF names."""

    def __init__(self) -> None:
        self.per_expert: dict[tuple[str, str], dict[int, torch.Tensor]] = {}  # (layer, gguf name) -> expert -> matrix

    def take(self, layer: str, module: str, kind: str, data: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
        """GGUF-named tensors for an HF tensor `model.layers.{layer}.{module}.{kind}`; None if it is not an MoE tensor."""
        if module in ROUTERS:
            return [(f"blk.{layer}.{ROUTERS[module]}.{kind}", data)]
        match = PER_EXPERT.match(f"{module}.{kind}")
        if match:
            expert, projection = match.groups()
            self.per_expert.setdefault((layer, PROJECTIONS[projection]), {})[int(expert)] = data
            return []
        name = f"{module}.{kind}" if kind in ("weight", "bias") else module
        if not name.startswith("mlp.experts."):
            return None
        return [(f"blk.{layer}.{gguf}", tensor) for gguf, tensor in _fused(name.removeprefix("mlp.experts."), data)]

    def finish(self) -> list[tuple[str, torch.Tensor]]:
        out = []
        for (layer, name), experts in self.per_expert.items():
            if sorted(experts) != list(range(len(experts))):
                raise UnsupportedError(f"layer {layer} lacks some experts of {name}: has {sorted(experts)}")
            out.append((f"blk.{layer}.{name}.weight", torch.stack([experts[e] for e in range(len(experts))])))
        return out


def _fused(name: str, data: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    # gpt-oss stores its projections input-first ([experts, in, out]) and interleaves gate and up columns.
    if name == "gate_up_proj":
        return [("ffn_gate_exps.weight", data[:, :, 0::2].transpose(1, 2).contiguous()),
                ("ffn_up_exps.weight", data[:, :, 1::2].transpose(1, 2).contiguous())]
    if name == "gate_up_proj_bias":
        return [("ffn_gate_exps.bias", data[:, 0::2].contiguous()), ("ffn_up_exps.bias", data[:, 1::2].contiguous())]
    if name == "down_proj":
        return [("ffn_down_exps.weight", data.transpose(1, 2).contiguous())]
    if name == "down_proj_bias":
        return [("ffn_down_exps.bias", data)]
    if name.endswith(("_blocks", "_scales")):
        raise UnsupportedError(f"expert tensor mlp.experts.{name} is MXFP4-packed safetensors, which is not read; "
                               "use the model's GGUF file, or dequantised (bf16) safetensors")
    raise UnsupportedError(f"unknown expert tensor mlp.experts.{name}")
