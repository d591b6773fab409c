"""Tiny random-weight models built by the tests: a Hugging Face directory (via transformers) and the same
weights written as GGUF with the `gguf` writer, named and laid out as llama.cpp's converter does."""

from pathlib import Path

import gguf
import numpy as np
import torch

ARCHITECTURES = ("llama", "qwen2", "gemma3")


def hf_config(arch: str):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 50_000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return LlamaConfig(**common, rope_parameters=rope)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 20_000.0})
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
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _permute_for_gguf(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves each head's rows (GPT-J RoPE layout) for the llama architecture."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(model, arch: str, path: Path) -> None:
    config = model.config
    gguf_arch = "gemma3" if arch == "gemma3" else arch
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

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                   "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                   "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm", "mlp.gate_proj": "ffn_gate",
                   "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "pre_feedforward_layernorm": "ffn_norm",
                   "post_feedforward_layernorm": "post_ffw_norm",
                   "post_attention_layernorm": "post_attention_norm" if arch == "gemma3" else "ffn_norm"}
    for hf_name, tensor in model.state_dict().items():
        if arch == "gemma3" and hf_name == "lm_head.weight":
            continue  # tied
        data = tensor.float().numpy().copy()
        if hf_name in names:
            name = names[hf_name]
        else:
            _, _, layer, *module, kind = hf_name.split(".")
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
