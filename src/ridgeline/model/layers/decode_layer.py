"""A decoder layer's rows in one call of the compiled kernels (csrc/decode_layer.cpp), where the layer allows it.

At batch 1 a layer's arithmetic is small, and going through its modules costs about as much again: ~12 crossings
from Python into the kernels per layer, each with its torch dispatch, argument checks and the Python around it.
The compiled DecodeLayer makes the same kernel calls, in the same order, from C++: every row gets the bits the
modules would give it, so which path a step takes changes nothing but its speed (and batch invariance holds on
both). The modules stay the definition and the fallback: off the CPU, without the kernels, for a mixture of
experts, dense weights, an activation the kernels lack, or a step whose prompt rows take the GEMM path.
"""

from operator import is_

import torch
from torch import nn

from ridgeline.model.attention_batch import AttentionBatch
from ridgeline.model.layers.attention import PagedAttention
from ridgeline.model.layers.kv_slots import KVSlots, kernel_pages
from ridgeline.model.layers.linear import PhaseAwareLinear
from ridgeline.model.layers.mlp import COMPILED, GatedMLP
from ridgeline.model.layers.norm import RMSNorm
from ridgeline.model.native import NO_TENSOR, compiled
from ridgeline.model.row_paths import RowPaths

# Switched off by tests and profiles that want the module-by-module path on a machine with the kernels.
enabled = True


def step_fits(h: torch.Tensor, paths: RowPaths, prompt_rows_fit: bool) -> bool:
    """Whether a step's activations may take the compiled calls: fp32 on the CPU, and every row on the int8 kernel
    (`prompt_rows_fit`: no linear has prompt rows take the GEMM; else only steps of generated rows fit)."""
    if not enabled or h.dtype is not torch.float32 or h.device.type != "cpu":
        return False
    return prompt_rows_fit or (paths.compute_rows is None and not paths.all_compute)


class FusedDecodeLayer:
    """The compiled layer and what a step must satisfy to take it."""

    def __init__(self, kernel, group: int, prompt_rows_fit: bool):
        self.kernel, self.group = kernel, group
        self.prompt_rows_fit = prompt_rows_fit

    def fits(self, h: torch.Tensor, paths: RowPaths) -> bool:
        return step_fits(h, paths, self.prompt_rows_fit)

    def __call__(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: AttentionBatch,
                 cache: tuple[KVSlots, KVSlots]) -> torch.Tensor:
        view = batch.groups[self.group]
        return self.kernel.forward(h.contiguous(), *rope, *kernel_pages(cache[0]), *kernel_pages(cache[1]),
                                   view.slot_mapping, view.block_tables, batch.row_seq, view.key_begin,
                                   batch.key_end, batch.block_size)


def fuse_layer(attn_norm: RMSNorm, attention: nn.Module, post_attn_norm: RMSNorm | None, ffn_norm: RMSNorm,
               mlp: nn.Module, post_ffn_norm: RMSNorm | None) -> FusedDecodeLayer | None:
    """The compiled layer for these modules, or None where some part of them needs the module path."""
    module = compiled()
    if module is None or not isinstance(attention, PagedAttention) or not isinstance(mlp, GatedMLP):
        return None
    if mlp.activation not in COMPILED or attention.head_dim % 32:
        return None
    norms = [attn_norm, post_attn_norm, ffn_norm, post_ffn_norm, attention.q_norm, attention.k_norm]
    present = [norm for norm in norms if norm is not None]
    if len({norm.eps for norm in present}) != 1 or any(not _compiled_norm(norm) for norm in present):
        return None
    linears = [*attention.qkv.linears, *mlp.gate_up.linears, attention.o, mlp.down]
    if not all(isinstance(linear, PhaseAwareLinear) and linear.quantized.compiled for linear in linears):
        return None
    if any((end - first) % 16 for _, first, end in mlp.gate_up.outputs):  # the activation's 16 lanes
        return None
    kernel = module.DecodeLayer(
        [NO_TENSOR if norm is None else norm.weight for norm in norms], present[0].eps,
        [_spec(linear) for linear in attention.qkv.linears], list(attention.qkv.outputs), _spec(attention.o),
        [_spec(linear) for linear in mlp.gate_up.linears], list(mlp.gate_up.outputs), _spec(mlp.down),
        mlp.gelu, attention.num_heads, attention.scale, NO_TENSOR if attention.sinks is None else attention.sinks)
    return FusedDecodeLayer(kernel, attention.group, not any(linear.quantized.prompt_uses_gemm for linear in linears))


def _compiled_norm(norm: RMSNorm) -> bool:
    weight = norm.weight
    return weight.device.type == "cpu" and weight.dtype is torch.float32 and weight.shape[-1] % 16 == 0


def _spec(linear: PhaseAwareLinear) -> tuple:
    """A linear as the kernel takes it: (GGML type, output rows, packed planes, bias or an empty tensor)."""
    layer = linear.quantized
    return int(layer.qtype), layer.out_features, list(layer.weight.planes), NO_TENSOR if layer.bias is None else layer.bias


class FusedDecodeStack:
    """Every layer's compiled call in one call of the kernels (csrc/decode_layer.h's DecodeStack): one crossing
    from Python per step instead of one per layer. Taken when every layer has a compiled call and the step fits
    them all."""

    def __init__(self, layers: list[FusedDecodeLayer], sliding: list[bool]):
        self.layers = layers
        self.kernel = compiled().DecodeStack([layer.kernel for layer in layers], [int(s) for s in sliding],
                                             [layer.group for layer in layers])
        self.prompt_rows_fit = all(layer.prompt_rows_fit for layer in layers)
        self._caches: tuple[list, list[list[torch.Tensor]]] | None = None  # (each layer's caches, their pages)

    def fits(self, h: torch.Tensor, paths: RowPaths) -> bool:
        return step_fits(h, paths, self.prompt_rows_fit)

    def __call__(self, *args) -> torch.Tensor:
        return self.forward(*args)  # (an instance's forward can be wrapped, as a module's is, by the step profiler)

    def forward(self, h: torch.Tensor, rope_global: tuple[torch.Tensor, torch.Tensor],
                rope_local: tuple[torch.Tensor, torch.Tensor], batch: AttentionBatch,
                kv_cache: list[tuple[KVSlots, KVSlots]]) -> torch.Tensor:
        groups = batch.groups
        return self.kernel.forward(h.contiguous(), [rope_global, rope_local], self._pages(kv_cache),
                                   [g.slot_mapping for g in groups], [g.block_tables for g in groups],
                                   [g.key_begin for g in groups], batch.row_seq, batch.key_end, batch.block_size)

    def _pages(self, kv_cache: list[tuple[KVSlots, KVSlots]]) -> list[list[torch.Tensor]]:
        # A runner hands the same list of caches every step: unpack its pages once, not 18 layers' worth per step.
        if self._caches is None or len(self._caches[0]) != len(kv_cache) or not all(map(is_, self._caches[0], kv_cache)):
            self._caches = list(kv_cache), [[*kernel_pages(k), *kernel_pages(v)] for k, v in kv_cache]
        return self._caches[1]
