"""Tiny random-weight models built by the tests: a Hugging Face directory (via transformers) and the same
weights written as GGUF with the `gguf` writer, named and laid out as llama.cpp's converter does."""

from pathlib import Path

import gguf
import numpy as np
import torch

ARCHITECTURES = ("llama", "qwen2", "gemma3", "qwen3", "qwen3moe", "gpt-oss")
MOE_ARCHITECTURES = ("qwen3moe", "gpt-oss")
GGUF_ARCH = {"qwen3moe": "qwen3moe", "gpt-oss": "gpt-oss"}


def hf_config(arch: str):
    from transformers import Gemma3TextConfig, GptOssConfig, LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 50_000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return LlamaConfig(**common, rope_parameters=rope)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 20_000.0})
    if arch == "qwen3":  # head_dim 32 is not hidden / heads (16), as in the real models
        return Qwen3Config(**common, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 20_000.0})
    if arch == "qwen3moe":
        return Qwen3MoeConfig(**common, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                              norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 20_000.0})
    if arch == "gpt-oss":  # 8-token sliding window on even layers; YaRN with llama.cpp's whole-dimension ramp ends
        yarn = {"rope_type": "yarn", "rope_theta": 150_000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_max_position_embeddings": 64, "truncate": True}
        return GptOssConfig(**{**common, "intermediate_size": 32}, head_dim=32, num_local_experts=8,
                            num_experts_per_tok=2, sliding_window=8, rope_parameters=yarn)
    return Gemma3TextConfig(**{**common, "tie_word_embeddings": True}, head_dim=32, query_pre_attn_scalar=24,
                            sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"])


def build_hf_model(arch: str, directory: Path, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(arch), torch_dtype=torch.float32).eval()
    with torch.no_grad():  # random norms, so that a missing "+1" or a misplaced norm shows up
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn_like(param) * 0.2 + (0.0 if arch == "gemma3" else 1.0))
            elif arch in MOE_ARCHITECTURES and ("mlp." in name or "sinks" in name):
                # Routers far from ties (a near-tie would pick experts by rounding), nonzero biases and sinks, and
                # expert activations large enough to reach gpt-oss's SwiGLU clamp (7).
                scale = {"router": 1.0, "gate.": 1.0, "bias": 0.5, "sinks": 1.0}
                param.copy_(torch.randn_like(param) * next((v for k, v in scale.items() if k in name), 0.6))
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _permute_for_gguf(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves each head's rows (GPT-J RoPE layout) for the llama architecture."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _moe_tensors(arch: str, hf_name: str, data: np.ndarray) -> list[tuple[str, np.ndarray]] | None:
    """An HF MoE tensor as llama.cpp's converter writes it: 3-D [experts, out, in] per projection, or None."""
    parts = hf_name.split(".")
    layer, module = parts[2], ".".join(parts[3:])
    if module.startswith(("mlp.gate.", "mlp.router.")):
        return [(f"blk.{layer}.ffn_gate_inp.{parts[-1]}", data)]
    if module.startswith("mlp.experts.") and parts[5].isdigit():
        return []  # per-expert matrices (Qwen3-MoE before transformers 5): stacked by write_gguf
    if arch == "gpt-oss":  # [experts, in, out], gate and up interleaved by column
        fused = {
            "mlp.experts.gate_up_proj": lambda: [("ffn_gate_exps.weight", data[:, :, 0::2].transpose(0, 2, 1)),
                                                 ("ffn_up_exps.weight", data[:, :, 1::2].transpose(0, 2, 1))],
            "mlp.experts.gate_up_proj_bias": lambda: [("ffn_gate_exps.bias", data[:, 0::2]),
                                                      ("ffn_up_exps.bias", data[:, 1::2])],
            "mlp.experts.down_proj": lambda: [("ffn_down_exps.weight", data.transpose(0, 2, 1))],
            "mlp.experts.down_proj_bias": lambda: [("ffn_down_exps.bias", data)],
        }
    else:  # transformers 5 holds Qwen3-MoE's experts as [experts, out, in], gate rows before up rows
        fused = {
            "mlp.experts.gate_up_proj": lambda: [("ffn_gate_exps.weight", data[:, : data.shape[1] // 2]),
                                                 ("ffn_up_exps.weight", data[:, data.shape[1] // 2:])],
            "mlp.experts.down_proj": lambda: [("ffn_down_exps.weight", data)],
        }
    if module in fused:
        return [(f"blk.{layer}.{name}", np.ascontiguousarray(value)) for name, value in fused[module]()]
    return None


def _stacked_experts(model) -> list[tuple[str, np.ndarray]]:
    state, config = model.state_dict(), model.config
    out = []
    for layer in range(config.num_hidden_layers):
        for hf, name in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            key = f"model.layers.{layer}.mlp.experts.{{}}.{hf}.weight"
            if key.format(0) in state:
                out.append((f"blk.{layer}.{name}.weight",
                            np.stack([state[key.format(e)].float().numpy() for e in range(config.num_experts)])))
    return out


def write_gguf(model, arch: str, path: Path, expert_type: gguf.GGMLQuantizationType | None = None,
               tokenizer: bool = False) -> None:
    """`expert_type`: quantise the expert matrices to this GGML type (default: f32 as everything else);
    `tokenizer`: store save_tokenizer's vocabulary too, so that the engine can serve the file."""
    config = model.config
    gguf_arch = GGUF_ARCH.get(arch, arch)
    writer = gguf.GGUFWriter(str(path), gguf_arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = config.rope_parameters
    if arch == "gemma3":
        writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        writer.add_sliding_window(config.sliding_window)
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])
        writer.add_attention_scale(config.query_pre_attn_scalar**-0.5)
    else:
        writer.add_rope_freq_base(rope["rope_theta"])
    if arch in MOE_ARCHITECTURES:
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(getattr(config, "moe_intermediate_size", config.intermediate_size))
    if arch == "gpt-oss":
        writer.add_sliding_window(config.sliding_window)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if tokenizer:
        _add_tokenizer(writer, config.vocab_size)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                   "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                   "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm", "mlp.gate_proj": "ffn_gate",
                   "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "pre_feedforward_layernorm": "ffn_norm",
                   "post_feedforward_layernorm": "post_ffw_norm",
                   "self_attn.sinks": "attn_sinks",
                   "post_attention_layernorm": "post_attention_norm" if arch in ("gemma3", "gpt-oss") else "ffn_norm"}

    def add(name: str, data: np.ndarray) -> None:
        if expert_type is not None and name.endswith("_exps.weight"):
            shape = data.shape
            data = gguf.quants.quantize(data.reshape(-1, shape[-1]), expert_type)
            data = data.reshape(*shape[:-1], -1)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=expert_type)
        else:
            writer.add_tensor(name, data)

    for name, data in _stacked_experts(model):
        add(name, data)
    for hf_name, tensor in model.state_dict().items():
        if arch == "gemma3" and hf_name == "lm_head.weight":
            continue  # tied
        data = tensor.float().numpy().copy()
        moe = _moe_tensors(arch, hf_name, data) if hf_name.startswith("model.layers.") else None
        if moe is not None:
            for name, value in moe:
                add(name, value)
            continue
        if hf_name in names:
            name = names[hf_name]
        else:
            _, _, layer, *module, kind = hf_name.split(".")
            if kind not in ("weight", "bias"):  # e.g. gpt-oss's `self_attn.sinks`
                module, kind = [*module, kind], "weight"
            name = f"blk.{layer}.{layer_names['.'.join(module)]}.{kind}"
        if arch == "gemma3" and "norm" in name:
            data = data + 1  # as llama.cpp's converter stores Gemma norms
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            data = _permute_for_gguf(data, heads)
        writer.add_tensor(name, data)
    if arch == "llama":
        from ridgeline.model.hf_loader import config_from_hf, llama3_frequency_factors

        ours = config_from_hf(config.to_dict())
        writer.add_tensor("rope_freqs.weight", llama3_frequency_factors(ours, rope).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_tokenizer(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    """save_tokenizer's byte-level BPE as GGUF metadata, padded with unused tokens to the model's vocabulary."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        save_tokenizer(Path(directory), vocab_size)
        bpe = json.loads((Path(directory) / "tokenizer.json").read_text())["model"]
    tokens = sorted(bpe["vocab"], key=bpe["vocab"].get)
    types = [gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.NORMAL] * (len(tokens) - 2)
    types += [gguf.TokenType.UNUSED] * (vocab_size - len(tokens))
    tokens += [f"<unused{i}>" for i in range(vocab_size - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)


def save_tokenizer(directory: Path, vocab_size: int = 384) -> None:
    """A byte-level BPE tokenizer.json small enough for the tiny models' vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the quick brown fox jumps over the lazy dog", "decode is memory bound", "prefill is compute bound"] * 20
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
