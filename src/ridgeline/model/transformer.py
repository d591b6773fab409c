"""The decoder-only transformer shared by every supported architecture (gemma3, llama, mistral, qwen2, qwen3,
qwen3moe, gpt-oss).

Architectures differ only in what ModelConfig says: QK-norm, sandwich norms, embedding scale, activation,
sliding-window layers, RoPE bases and scaling, biases, attention sinks, and a mixture of experts in place of the
dense MLP. Weights come as StoredTensors with GGUF names.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ridgeline.errors import ModelLoadError, RidgelineError
from ridgeline.model.attention_batch import AttentionBatch
from ridgeline.model.checkpoint import Checkpoint
from ridgeline.model.kv_groups import layer_groups
from ridgeline.model.layers.attention import PagedAttention
from ridgeline.model.layers.decode_layer import FusedDecodeLayer, FusedDecodeStack, fuse_layer
from ridgeline.model.layers.embedding import TokenEmbedding
from ridgeline.model.layers.linear import WEIGHT_FORMATS, PhaseAwareLinear, make_linear
from ridgeline.model.layers.mlp import GatedMLP
from ridgeline.model.layers.moe import MixtureOfExperts
from ridgeline.model.layers.norm import RMSNorm
from ridgeline.model.layers.rope import RotaryEmbedding
from ridgeline.model.layers.shared_input import SharedInputLinear
from ridgeline.model.quant import kernels
from ridgeline.model.quant.requantize import LM_HEAD_FORMATS, requantize
from ridgeline.model.row_paths import RowPaths
from ridgeline.model.weights import StoredTensor


@dataclass(frozen=True)
class ModelOptions:
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32  # activation dtype between layers
    weights: str = "quantized"  # "quantized" (kept as stored), "bf16" or "f32" (dequantised at load)
    lm_head: str = "keep"  # "keep" the LM head as stored, or requantise it: "q8" (Q8_0), "q4" (Q4_0)

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_FORMATS:
            raise RidgelineError(f"unknown weight format {self.weights!r} (choose from {', '.join(WEIGHT_FORMATS)})")
        if self.lm_head not in LM_HEAD_FORMATS:
            raise RidgelineError(f"unknown --lm-head {self.lm_head!r} (choose from {', '.join(LM_HEAD_FORMATS)})")


class DecoderLayer(nn.Module):
    def __init__(self, attn_norm, attention, post_attn_norm, ffn_norm, mlp, post_ffn_norm):
        super().__init__()
        self.attn_norm, self.attention, self.post_attn_norm = attn_norm, attention, post_attn_norm
        self.ffn_norm, self.mlp, self.post_ffn_norm = ffn_norm, mlp, post_ffn_norm
        self._fused: FusedDecodeLayer | None | bool = False  # False: not looked for yet

    def fused(self) -> FusedDecodeLayer | None:
        """The layer as one compiled call (layers/decode_layer.py), made on first use: None where it cannot be."""
        if self._fused is False:
            self._fused = fuse_layer(self.attn_norm, self.attention, self.post_attn_norm, self.ffn_norm, self.mlp,
                                     self.post_ffn_norm)
        return self._fused

    def _apply(self, fn, recurse=True):
        self._fused = False  # it holds the weights' tensors: moved or cast, they are new ones
        return super()._apply(fn, recurse)

    def forward(self, h, rope, batch, cache):
        fused = self.fused()
        if fused is not None and fused.fits(h, batch.row_paths):
            return fused(h, rope, batch, cache)
        attended = self.attention(self.attn_norm(h), rope, batch, cache)
        h = h + attended if self.post_attn_norm is None else self.post_attn_norm(attended, residual=h)
        mixed = self.mlp(self.ffn_norm(h), batch.row_paths)
        return h + mixed if self.post_ffn_norm is None else self.post_ffn_norm(mixed, residual=h)


class Transformer(nn.Module):
    def __init__(self, checkpoint: Checkpoint, options: ModelOptions):
        super().__init__()
        config, tensors = checkpoint.config, checkpoint.tensors
        self.config, self.options = config, options

        def tensor(name: str, required: bool = True) -> StoredTensor | None:
            if name not in tensors and required:
                raise ModelLoadError(f"{checkpoint.path}: missing tensor {name}")
            return tensors.get(name)

        def linear(name: str) -> nn.Module:
            return make_linear(tensor(f"{name}.weight"), tensor(f"{name}.bias", required=False),
                               options.weights, options.device)

        def shared_input(*names: str) -> SharedInputLinear:
            return SharedInputLinear([tensor(f"{n}.weight") for n in names],
                                     [tensor(f"{n}.bias", required=False) for n in names], options.weights, options.device)

        def norm(name: str) -> RMSNorm:
            return RMSNorm(tensor(name).dequantize().to(options.device), config.rms_norm_eps)

        def gated_mlp(gate_up: SharedInputLinear, down: nn.Module) -> GatedMLP:
            return GatedMLP(gate_up, down, config.activation, config.swiglu_alpha, config.swiglu_limit)

        def experts(p: str) -> MixtureOfExperts:
            stacked = {name: tensor(f"{p}.{name}.weight") for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}
            biases = {name: tensor(f"{p}.{name}.bias", required=False) for name in stacked}
            if stacked["ffn_gate_exps"].shape[0] != config.num_experts:
                raise ModelLoadError(f"{checkpoint.path}: {p}.ffn_gate_exps holds {stacked['ffn_gate_exps'].shape[0]} "
                                     f"experts, the metadata says {config.num_experts}")

            def part(name: str, e: int) -> tuple[StoredTensor, StoredTensor | None]:
                bias = biases[name]
                return stacked[name].expert(e), None if bias is None else bias.expert(e)

            mlps = []
            for e in range(config.num_experts):
                (gate, gate_bias), (up, up_bias), (down, down_bias) = (part(n, e) for n in stacked)
                mlps.append(gated_mlp(SharedInputLinear([gate, up], [gate_bias, up_bias], options.weights, options.device),
                                      make_linear(down, down_bias, options.weights, options.device)))
            return MixtureOfExperts(linear(f"{p}.ffn_gate_inp"), mlps, config.experts_per_token, config.routing,
                                    config.norm_topk_prob)

        groups = layer_groups(config)
        group_of_layer = {layer: index for index, group in enumerate(groups) for layer in group.layers}
        self.group_windows = [group.window for group in groups]
        layers = []
        for i in range(config.num_layers):
            p = f"blk.{i}"
            attention = PagedAttention(
                shared_input(f"{p}.attn_q", f"{p}.attn_k", f"{p}.attn_v"), linear(f"{p}.attn_output"),
                config.num_heads, config.num_kv_heads, config.head_dim, config.softmax_scale,
                group_of_layer[i],
                norm(f"{p}.attn_q_norm.weight") if config.qk_norm else None,
                norm(f"{p}.attn_k_norm.weight") if config.qk_norm else None,
                tensor(f"{p}.attn_sinks.weight").dequantize() if config.attention_sinks else None,
            )
            if config.num_experts:
                mlp = experts(p)
            else:
                mlp = gated_mlp(shared_input(f"{p}.ffn_gate", f"{p}.ffn_up"), linear(f"{p}.ffn_down"))
            sandwich = config.sandwich_norms
            layers.append(DecoderLayer(
                norm(f"{p}.attn_norm.weight"), attention,
                norm(f"{p}.post_attention_norm.weight") if sandwich else None,
                norm(f"{p}.ffn_norm.weight"), mlp,
                norm(f"{p}.post_ffw_norm.weight") if sandwich else None,
            ))
        self.layers = nn.ModuleList(layers)
        self.norm = norm("output_norm.weight")
        embedding = tensor("token_embd.weight")
        head = embedding if config.tie_word_embeddings else tensor("output.weight")
        if LM_HEAD_FORMATS[options.lm_head] is not None:
            head = requantize(head, LM_HEAD_FORMATS[options.lm_head])
        self.lm_head = make_linear(head, None, options.weights, options.device)
        shares_head = (head is embedding and isinstance(self.lm_head, PhaseAwareLinear)
                       and kernels.uses_compiled_kernels(self.lm_head.quantized.weight))
        self.embedding = TokenEmbedding(self.lm_head.quantized if shares_head else embedding, config.embedding_scale,
                                        options.dtype, options.device)

        divisors = tensors.get("rope_freqs.weight")
        divisors = divisors.dequantize() if divisors is not None else None
        self.rope_global = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_linear_factor,
                                           divisors, options.device, config.rope_yarn)
        self.rope_local = (RotaryEmbedding(config.head_dim, config.rope_local_theta, device=options.device)
                           if config.rope_local_theta else self.rope_global)
        self._stack: FusedDecodeStack | None | bool = False  # False: not looked for yet

    def fused_stack(self) -> FusedDecodeStack | None:
        """Every layer in one compiled call (layers/decode_layer.py), made on first use: None unless every layer
        has its compiled call."""
        if self._stack is False:
            layers = [layer.fused() for layer in self.layers]
            self._stack = None if None in layers else FusedDecodeStack(
                layers, [self.config.is_sliding(i) for i in range(len(layers))])
        return self._stack

    def _apply(self, fn, recurse=True):
        self._stack = False  # it holds the layers' compiled calls, which hold the weights' tensors
        return super()._apply(fn, recurse)

    @torch.inference_mode()
    def forward(self, batch: AttentionBatch, kv_cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Logits (fp32) for `batch.logit_rows` only: the LM head is the largest matmul of a decode step."""
        h = self.embedding(batch.token_ids)
        rope_global = self.rope_global.cos_sin(batch.positions)
        rope_local = rope_global if self.rope_local is self.rope_global else self.rope_local.cos_sin(batch.positions)
        stack = self.fused_stack()
        if stack is not None and stack.fits(h, batch.row_paths):
            h = stack(h, rope_global, rope_local, batch, kv_cache)
        else:
            for i, layer in enumerate(self.layers):
                rope = rope_local if self.config.is_sliding(i) else rope_global
                h = layer(h, rope, batch, kv_cache[i])
        h = self.norm(h[batch.logit_rows])
        # Logit rows always take the memory-bound path: the head is 262k rows here, and dequantising it for a
        # GEMM would cost more than it saves; one path also keeps every row's logits batch-independent.
        return self.lm_head(h, RowPaths.memory_bound(h.shape[0])).float()

