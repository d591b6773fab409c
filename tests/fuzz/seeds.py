"""Small valid model files to start fuzzing from: GGUF files of a few KB (both tokenizer kinds, a quantised
tensor among them) and Hugging Face config.json dicts of every supported architecture."""

from pathlib import Path

import gguf
import numpy as np

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 32, 32, 2, 1, 8


def _spm_vocab(writer: gguf.GGUFWriter) -> None:
    tokens = ["<unk>", "<s>", "</s>", "<0x41>", "\u2581a", "b", "\u2581ab", "<start_of_turn>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.BYTE,
             gguf.TokenType.NORMAL, gguf.TokenType.NORMAL, gguf.TokenType.NORMAL, gguf.TokenType.CONTROL]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -0.5, 0.0])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")


def _bpe_vocab(writer: gguf.GGUFWriter) -> None:
    tokens = ["<s>", "</s>", "a", "b", "\u0120", "ab", "\u0120a", "\u0120ab"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.NORMAL] * 6)
    writer.add_token_merges(["a b", "\u0120 a", "\u0120a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(False)


def write_seed_gguf(path: Path, arch: str = "llama", vocab: str = "spm", overrides: dict | None = None) -> Path:
    """overrides: metadata key -> (value, GGUFValueType) written instead of the seed's own (None: key dropped)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10_000.0)
    if arch == "gemma3":
        writer.add_sliding_window(16)
        writer.add_sliding_window_pattern([True])
    (_spm_vocab if vocab == "spm" else _bpe_vocab)(writer)
    rng = np.random.default_rng(0)
    head_dim = HIDDEN // HEADS

    def add(name: str, *shape: int, quantize: bool = False) -> None:
        data = rng.normal(0, 0.2, shape).astype(np.float32) if len(shape) > 1 else np.ones(shape, np.float32)
        if quantize:  # Q8_0: the packed bytes, as llama.cpp's converter writes them
            writer.add_tensor(name, gguf.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)

    add("token_embd.weight", VOCAB, HIDDEN, quantize=True)
    add("output_norm.weight", HIDDEN)
    add("blk.0.attn_norm.weight", HIDDEN)
    add("blk.0.attn_q.weight", HIDDEN, HIDDEN)
    add("blk.0.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
    add("blk.0.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
    add("blk.0.attn_output.weight", HIDDEN, HIDDEN)
    add("blk.0.ffn_norm.weight", HIDDEN)
    add("blk.0.ffn_gate.weight", FFN, HIDDEN)
    add("blk.0.ffn_up.weight", FFN, HIDDEN)
    add("blk.0.ffn_down.weight", HIDDEN, FFN)
    if arch == "gemma3":
        add("blk.0.attn_q_norm.weight", head_dim)
        add("blk.0.attn_k_norm.weight", head_dim)
        add("blk.0.post_attention_norm.weight", HIDDEN)
        add("blk.0.post_ffw_norm.weight", HIDDEN)
    for key, override in (overrides or {}).items():
        writer.kv_data[0].pop(key, None)
        if override is not None:
            value, kind = override
            sub_type = None
            if kind == gguf.GGUFValueType.ARRAY:
                kind, sub_type = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.get_type(value[0])
            writer.kv_data[0][key] = gguf.GGUFValue(value=value, type=kind, sub_type=sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


SEED_GGUFS = {"llama_spm": ("llama", "spm"), "qwen2_bpe": ("qwen2", "bpe"), "gemma3_spm": ("gemma3", "spm")}


def write_seed_ggufs(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [write_seed_gguf(directory / f"{name}.gguf", *spec) for name, spec in SEED_GGUFS.items()]


def seed_hf_configs() -> list[dict]:
    common = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)
    return [
        {**common, "model_type": "llama", "rope_theta": 50_000.0,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64}},
        {**common, "model_type": "qwen2", "rope_parameters": {"rope_type": "default", "rope_theta": 20_000.0}},
        {**common, "model_type": "mistral", "sliding_window": 4096, "use_sliding_window": True},
        {"model_type": "gemma3", "text_config": {**common, "head_dim": 32, "query_pre_attn_scalar": 24,
         "sliding_window": 8, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}},
    ]


def write_seed_safetensors(path: Path, config: dict) -> Path:
    """Random weights of the shapes a (non-Gemma) seed config implies, under Hugging Face's tensor names."""
    import torch
    from safetensors.torch import save_file

    hidden, ffn, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv_heads, vocab = config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]
    head_dim = hidden // heads
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.2

    tensors = {"model.embed_tokens.weight": randn(vocab, hidden), "model.norm.weight": torch.ones(hidden),
               "lm_head.weight": randn(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors.update({
            f"{p}.self_attn.q_proj.weight": randn(heads * head_dim, hidden),
            f"{p}.self_attn.k_proj.weight": randn(kv_heads * head_dim, hidden),
            f"{p}.self_attn.v_proj.weight": randn(kv_heads * head_dim, hidden),
            f"{p}.self_attn.o_proj.weight": randn(hidden, heads * head_dim),
            f"{p}.mlp.gate_proj.weight": randn(ffn, hidden), f"{p}.mlp.up_proj.weight": randn(ffn, hidden),
            f"{p}.mlp.down_proj.weight": randn(hidden, ffn),
            f"{p}.input_layernorm.weight": torch.ones(hidden), f"{p}.post_attention_layernorm.weight": torch.ones(hidden),
        })
    save_file(tensors, str(path))
    return path


# What coverage-guided fuzzing found, each kept as the change to a seed file that reproduces it (the repository
# tracks no model files): name -> a function writing that file. A new crasher goes here, reduced to the part of
# the input that matters, with the ModelLoadError it must now end in (tests/test_hostile_files.py checks both).
def _layer_without_attn_q(path: Path) -> Path:
    # libFuzzer flipped one byte of a tensor name: the layer's attn_q is gone (was a KeyError deep in the loader).
    seed = write_seed_gguf(path, "llama", "spm")
    seed.write_bytes(seed.read_bytes().replace(b"blk.0.attn_q.weight", b"blk.0.attn[q.weight"))
    return seed


def _bpe_merge_without_space(path: Path) -> Path:
    # A BPE merge that is not "left right" (was an unpacking ValueError in the tokenizer's build).
    return write_seed_gguf(path, "qwen2", "bpe", overrides={
        "tokenizer.ggml.merges": (["a b", "\0\0\x005", "\u0120a b"], gguf.GGUFValueType.ARRAY)})


CRASHER_GGUFS = {  # name -> (writer, what the load must say)
    "layer_without_attn_q": (_layer_without_attn_q, "missing tensor blk.0.attn_q.weight"),
    "bpe_merge_without_space": (_bpe_merge_without_space, "should be a list of 'left right' strings"),
}


def write_crasher_ggufs(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [write(directory / f"{name}.gguf") for name, (write, _) in CRASHER_GGUFS.items()]
