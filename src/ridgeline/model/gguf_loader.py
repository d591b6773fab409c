"""Read a GGUF file (its header via the `gguf` package, cached; tensors memory-mapped) into a ModelConfig and
StoredTensors."""

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from gguf import GGMLQuantizationType

from ridgeline.errors import ModelLoadError, UnsupportedError
from ridgeline.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, YarnScaling
from ridgeline.model.gguf_index import load_index
from ridgeline.model.metadata_values import MAX_COUNT, MAX_LAYERS, metadata_float, metadata_int
from ridgeline.model.tensor_shapes import check_shapes
from ridgeline.model.weights import SUPPORTED_TYPES, StoredTensor

GEMMA3_GLOBAL_EVERY = 6  # llama.cpp's fixed pattern when the file does not list sliding layers
GEMMA3_LOCAL_ROPE_BASE = 10_000.0  # older files do not store it; llama.cpp hard-codes it


def config_from_metadata(meta: dict, tensor_names: set[str]) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def get(key: str, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    def count(key: str, default=None, high: int = MAX_COUNT, low: int = 1) -> int:
        return metadata_int(f"{arch}.{key}", get(key, default), low=low, high=high)

    def number(key: str, default=None) -> float:
        return metadata_float(f"{arch}.{key}", get(key, default))

    hidden = count("embedding_length")
    heads = count("attention.head_count")
    kv_heads = count("attention.head_count_kv", heads)
    head_dim = count("attention.key_length", max(hidden // heads, 1))
    layers = count("block_count", high=MAX_LAYERS, low=0)  # 0: a file of header and vocabulary alone (harmless)
    vocab = meta.get(f"{arch}.vocab_size")  # else the embedding's rows (set by load_gguf), not the token list's length
    rope_linear = 1.0
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        rope_linear = number("rope.scaling.factor", 1.0)
    experts = int(meta.get(f"{arch}.expert_count", 0))
    expert_ffn = int(get("expert_feed_forward_length")) if experts else 0
    common = dict(
        architecture=arch,
        vocab_size=metadata_int(f"{arch}.vocab_size", vocab) if vocab else 0,
        hidden_size=hidden,
        intermediate_size=count("feed_forward_length", expert_ffn or None),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_context=count("context_length"),
        rms_norm_eps=number("attention.layer_norm_rms_epsilon"),
        rope_theta=number("rope.freq_base", 10_000.0),
        rope_linear_factor=rope_linear,
        tie_word_embeddings="output.weight" not in tensor_names,
    )
    window = meta.get(f"{arch}.attention.sliding_window")
    window = metadata_int(f"{arch}.attention.sliding_window", window, 0) if window is not None else None
    if arch == "gemma3":
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
        if isinstance(pattern, list):
            sliding = tuple(i for i, is_local in enumerate(pattern) if is_local)
        else:
            sliding = tuple(i for i in range(layers) if i % GEMMA3_GLOBAL_EVERY != GEMMA3_GLOBAL_EVERY - 1)
        return ModelConfig(
            **common,
            rope_local_theta=number("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE),
            sliding_window=int(window) if window else None,
            sliding_layers=sliding if window else (),
            qk_norm=True,
            sandwich_norms=True,
            embedding_scale=hidden**0.5,
            attention_scale=number("attention.scale", head_dim**-0.5),
            activation="gelu_tanh",
        )
    if arch == "gpt-oss":  # llama.cpp's fixed pattern: even layers slide, odd ones attend to everything
        sliding = tuple(range(0, layers, 2)) if window else ()
    else:
        sliding = tuple(range(layers)) if window else ()
    moe = {}
    if experts:
        moe = dict(num_experts=experts, experts_per_token=int(get("expert_used_count")),
                   expert_intermediate_size=expert_ffn)
    if arch == "qwen3moe":  # llama.cpp always renormalises Qwen3-MoE's top-k weights
        moe.update(routing="softmax_topk", norm_topk_prob=bool(meta.get(f"{arch}.expert_weights_norm", True)))
    if arch == "gpt-oss":  # the clamped SwiGLU's alpha and limit are fixed in llama.cpp too
        moe.update(routing="topk_softmax", attention_sinks=True, activation="swiglu_oai")
    return ModelConfig(
        **common,
        rope_yarn=_yarn(meta, arch),
        sliding_window=int(window) if window else None,
        sliding_layers=sliding,
        attention_bias=f"blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        **moe,
    )


def _yarn(meta: dict, arch: str) -> YarnScaling | None:
    if meta.get(f"{arch}.rope.scaling.type") != "yarn":
        return None
    key = f"{arch}.rope.scaling"
    return YarnScaling(float(meta[f"{key}.factor"]), int(meta[f"{key}.original_context_length"]),
                       float(meta.get(f"{key}.yarn_beta_fast", 32.0)), float(meta.get(f"{key}.yarn_beta_slow", 1.0)),
                       truncate=True)  # llama.cpp rounds the ramp's ends to whole dimensions


def _unpermute_rows(weight: StoredTensor, num_heads: int) -> StoredTensor:
    """llama.cpp's converter interleaves each head's rows for GPT-J-style RoPE; restore the HF (rotate-half) order
    so that every architecture shares one RoPE. Works on quantised rows because blocks run along the input dim."""
    head_dim = weight.shape[0] // num_heads
    half = head_dim // 2
    order = torch.arange(weight.shape[0]).reshape(num_heads, half, 2).transpose(1, 2).reshape(-1)
    return weight.select_rows(order)


def load_gguf(path: Path) -> tuple[ModelConfig, dict[str, StoredTensor], dict[str, Any]]:
    """The config, the tensors (views of the file's memory map) and every metadata field of a GGUF file."""
    index = load_index(path)
    names = {entry.name for entry in index.tensors}
    config = config_from_metadata(index.fields, names)
    tensors: dict[str, StoredTensor] = {}
    views = index.tensor_data(path)
    for entry in index.tensors:
        qtype = GGMLQuantizationType(entry.tensor_type)
        if qtype not in SUPPORTED_TYPES:
            raise UnsupportedError(f"tensor {entry.name} has unsupported type {qtype.name}")
        shape = tuple(reversed(entry.dims))  # GGUF lists dims innermost-first
        with warnings.catch_warnings():  # the map is read-only and we never write to it
            warnings.simplefilter("ignore", UserWarning)
            data = torch.from_numpy(views[entry.name])  # zero-copy view of the memory map
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = data.reshape(shape)
        elif qtype == GGMLQuantizationType.BF16:
            data = data.view(torch.bfloat16).reshape(shape)
        tensors[entry.name] = StoredTensor(qtype, shape, data)
    check_shapes(config, tensors, path)
    if config.vocab_size == 0 and "token_embd.weight" in tensors:
        config = replace(config, vocab_size=tensors["token_embd.weight"].shape[0])
    if config.architecture == "gpt-oss":  # its post-attention norm is the MLP's input norm, as ffn_norm elsewhere
        for i in range(config.num_layers):
            if f"blk.{i}.post_attention_norm.weight" in tensors:
                tensors[f"blk.{i}.ffn_norm.weight"] = tensors.pop(f"blk.{i}.post_attention_norm.weight")
    if config.architecture in ("llama", "mistral"):
        for i in range(config.num_layers):
            q, k = f"blk.{i}.attn_q.weight", f"blk.{i}.attn_k.weight"
            for name in (q, k):
                if name not in tensors:
                    raise ModelLoadError(f"{path}: missing tensor {name}")
            tensors[q] = _unpermute_rows(tensors[q], config.num_heads)
            tensors[k] = _unpermute_rows(tensors[k], config.num_kv_heads)
    return config, tensors, index.fields

