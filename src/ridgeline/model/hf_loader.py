"""Read a Hugging Face model directory (config.json + *.safetensors) into a ModelConfig and StoredTensors.

Tensors are renamed to the GGUF names so that one model definition serves both formats.
"""

import json
import math
import re
from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from safetensors import safe_open

from ridgeline.errors import ModelLoadError, UnsupportedError
from ridgeline.model.config import ModelConfig, YarnScaling
from ridgeline.model.hf_experts import ExpertTensors
from ridgeline.model.metadata_values import MAX_LAYERS, metadata_float, metadata_int
from ridgeline.model.tensor_shapes import check_shapes
from ridgeline.model.weights import StoredTensor

MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "gemma3_text": "gemma3", "gemma3": "gemma3",
               "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss"}
DTYPES = {
    torch.float32: GGMLQuantizationType.F32,
    torch.float16: GGMLQuantizationType.F16,
    torch.bfloat16: GGMLQuantizationType.BF16,
}
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.sinks": "attn_sinks",
}
TOP_LEVEL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                   "lm_head.weight": "output.weight"}
LAYER_PATTERN = re.compile(r"^model\.layers\.(\d+)\.(.+?)(?:\.(weight|bias))?$")


def _rope_parameters(hf: dict) -> dict:
    """Merge the pre-v5 (rope_theta + rope_scaling) and v5 (rope_parameters) spellings."""
    params = {"rope_theta": hf.get("rope_theta", 10_000.0)}
    params.update(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    return params


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") == "gemma3" and "text_config" in hf:
        hf = {**hf["text_config"], "model_type": "gemma3_text"}
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise UnsupportedError(f"unsupported model_type {model_type!r} in config.json (supported: {', '.join(MODEL_TYPES)})")
    arch = MODEL_TYPES[model_type]
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    layers = metadata_int("num_hidden_layers", hf["num_hidden_layers"], high=MAX_LAYERS)
    rope = _rope_parameters(hf)
    common = dict(
        architecture=arch,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        max_context=hf.get("max_position_embeddings", 4096),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=hf.get("tie_word_embeddings", arch == "gemma3"),
    )
    if arch == "gemma3":
        full, local = rope.get("full_attention", rope), rope.get("sliding_attention", {})
        layer_types = hf.get("layer_types") or [
            "full_attention" if (i + 1) % hf.get("sliding_window_pattern", 6) == 0 else "sliding_attention"
            for i in range(layers)
        ]
        window = hf.get("sliding_window")
        linear = full.get("factor", 1.0) if full.get("rope_type", full.get("type")) == "linear" else 1.0
        return ModelConfig(
            **common,
            rope_theta=float(full.get("rope_theta", 1_000_000.0)),
            rope_local_theta=float(local.get("rope_theta", hf.get("rope_local_base_freq", 10_000.0))),
            rope_linear_factor=float(linear),
            sliding_window=window,
            sliding_layers=tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention") if window else (),
            qk_norm=True,
            sandwich_norms=True,
            embedding_scale=hf["hidden_size"] ** 0.5,
            attention_scale=hf.get("query_pre_attn_scalar", head_dim) ** -0.5,
            activation="gelu_tanh",
        )
    if arch == "gpt-oss":
        window = hf.get("sliding_window")
        layer_types = hf.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                for i in range(layers)]
        sliding = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention") if window else ()
    else:
        window = hf.get("sliding_window") if hf.get("use_sliding_window", arch == "mistral") else None
        sliding = tuple(range(layers)) if window else ()
    return ModelConfig(
        **common,
        rope_theta=float(rope["rope_theta"]),
        rope_yarn=_yarn(rope),
        sliding_window=window,
        sliding_layers=sliding,
        attention_bias=arch == "qwen2" or hf.get("attention_bias", False),
        qk_norm=arch in ("qwen3", "qwen3moe"),
        **_moe_fields(hf, arch),
    )


def _yarn(rope: dict) -> YarnScaling | None:
    if rope.get("rope_type", rope.get("type")) != "yarn":
        return None
    return YarnScaling(float(rope["factor"]), int(rope["original_max_position_embeddings"]),
                       float(rope.get("beta_fast") or 32.0), float(rope.get("beta_slow") or 1.0),
                       bool(rope.get("truncate", True)))


def _moe_fields(hf: dict, arch: str) -> dict:
    if arch == "qwen3moe":
        if hf.get("mlp_only_layers") or hf.get("decoder_sparse_step", 1) != 1:
            raise UnsupportedError("qwen3_moe with dense layers (mlp_only_layers / decoder_sparse_step) is not supported")
        return dict(num_experts=hf.get("num_experts") or hf["num_local_experts"],
                    experts_per_token=hf["num_experts_per_tok"], expert_intermediate_size=hf["moe_intermediate_size"],
                    routing="softmax_topk", norm_topk_prob=bool(hf.get("norm_topk_prob", False)))
    if arch == "gpt-oss":
        return dict(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
                    expert_intermediate_size=hf["intermediate_size"], routing="topk_softmax", attention_sinks=True,
                    activation="swiglu_oai", swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
                    swiglu_limit=float(hf.get("swiglu_limit", 7.0)))
    return {}


def llama3_frequency_factors(config: ModelConfig, rope: dict) -> torch.Tensor:
    """Per-frequency divisors of Llama 3.1's RoPE scaling, in the form GGUF stores them (`rope_freqs.weight`)."""
    factor = metadata_float("rope_scaling.factor", rope["factor"])
    low = metadata_float("rope_scaling.low_freq_factor", rope.get("low_freq_factor", 1.0))
    high = metadata_float("rope_scaling.high_freq_factor", rope.get("high_freq_factor", 4.0))
    original = metadata_float("rope_scaling.original_max_position_embeddings", rope.get("original_max_position_embeddings", 8192))
    inv_freq = config.rope_theta ** (-torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim)
    wavelength = 2 * math.pi / inv_freq
    smooth = ((original / wavelength - low) / (high - low)).clamp(0, 1)
    # smooth = 0: fully scaled (long wavelengths); smooth = 1: untouched (short ones)
    return (1 / ((1 - smooth) / factor + smooth)).float()


def _gguf_tensors(hf_name: str, data: torch.Tensor, arch: str, experts: ExpertTensors) -> list[tuple[str, torch.Tensor]]:
    """The tensor under its GGUF name(s): none if the model does not use it, several for fused expert tensors."""
    if hf_name in TOP_LEVEL_NAMES:
        return [(TOP_LEVEL_NAMES[hf_name], data)]
    match = LAYER_PATTERN.match(hf_name)
    if not match:
        return []
    layer, module, kind = match.groups()
    moe = experts.take(layer, module, kind, data)
    if moe is not None:
        return moe
    if module == "post_attention_layernorm":
        name = "post_attention_norm" if arch == "gemma3" else "ffn_norm"
    else:
        name = LAYER_NAMES.get(module)
    return [(f"blk.{layer}.{name}.{kind or 'weight'}", data)] if name else []


# A missing key, or a value of the wrong type or range: config.json is data, not something to trust.
_BAD_CONFIG = (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError, IndexError)


def _not_a_model(config_file: Path, error: Exception) -> ModelLoadError:
    return ModelLoadError(f"{config_file} does not describe a model: {type(error).__name__} {error}"[:500])


def load_hf_dir(path: Path) -> tuple[ModelConfig, dict[str, StoredTensor]]:
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{path} has no config.json")
    try:
        hf = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"{config_file} is not valid JSON: {error}") from None
    try:
        config = config_from_hf(hf)
    except _BAD_CONFIG as error:
        raise _not_a_model(config_file, error) from None
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors files")
    tensors: dict[str, StoredTensor] = {}
    experts = ExpertTensors()

    def store(name: str, data: torch.Tensor) -> None:
        if config.architecture == "gemma3" and name.endswith("norm.weight"):
            data = data.float() + 1  # Gemma's RMSNorm scales by (1 + w); GGUF stores 1 + w
        tensors[name] = StoredTensor(DTYPES[data.dtype], tuple(data.shape), data)

    for file in files:
        try:
            with safe_open(file, framework="pt") as handle:
                for hf_name in handle.keys():
                    short = hf_name.removeprefix("language_model.")
                    if short not in TOP_LEVEL_NAMES and not LAYER_PATTERN.match(short):
                        continue  # e.g. a vision tower: not read at all
                    data = handle.get_tensor(hf_name)
                    for name, converted in _gguf_tensors(short, data, config.architecture, experts):
                        if converted.dtype not in DTYPES:
                            raise UnsupportedError(f"tensor {hf_name} has unsupported dtype {converted.dtype}")
                        store(name, converted)
        except (OSError, RuntimeError) as error:
            raise ModelLoadError(f"{file} is not a readable safetensors file: {error}") from None
    for name, stacked in experts.finish():
        store(name, stacked)
    try:
        rope = _rope_parameters(hf)
        factors = llama3_frequency_factors(config, rope) if rope.get("rope_type", rope.get("type")) == "llama3" else None
    except _BAD_CONFIG as error:
        raise _not_a_model(config_file, error) from None
    if factors is not None:
        tensors["rope_freqs.weight"] = StoredTensor(GGMLQuantizationType.F32, tuple(factors.shape), factors)
    if config.tie_word_embeddings:
        tensors.pop("output.weight", None)
    check_shapes(config, tensors, path)
    return config, tensors
