"""Every tensor a model file holds must have the shape its config implies, and the config's layer count must be
the file's, checked once at load time: a file whose header and tensors disagree ends in one ModelLoadError
instead of a matmul error mid-request, or a loop over the 2**31 layers a config claimed."""

import re

from ridgeline.errors import ModelLoadError
from ridgeline.model.config import ModelConfig
from ridgeline.model.weights import StoredTensor

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")


def _layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    hidden, ffn, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    shapes = {
        "attn_q.weight": (q, hidden), "attn_k.weight": (kv, hidden), "attn_v.weight": (kv, hidden),
        "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,), "attn_output.weight": (hidden, q),
        "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
        "ffn_gate.weight": (ffn, hidden), "ffn_up.weight": (ffn, hidden), "ffn_down.weight": (hidden, ffn),
    }
    for norm in ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm"):
        shapes[f"{norm}.weight"] = (hidden,)
    return shapes


def check_shapes(config: ModelConfig, tensors: dict[str, StoredTensor], source: object) -> None:
    """Raise ModelLoadError for the first tensor whose shape the config contradicts (absent ones are the
    model's business: it names the one it needs), or when the file's layers are not the config's."""
    if config.head_dim % 2:
        raise ModelLoadError(f"{source}: head_dim {config.head_dim} is odd; rotary embeddings need pairs")
    embedding = tensors.get("token_embd.weight")
    vocab = config.vocab_size or (embedding.shape[0] if embedding is not None and embedding.shape else 0)
    whole_model = {"token_embd.weight": (vocab, config.hidden_size), "output.weight": (vocab, config.hidden_size),
                   "output_norm.weight": (config.hidden_size,), "rope_freqs.weight": (config.head_dim // 2,)}
    per_layer = _layer_shapes(config)
    layers = set()
    for name, tensor in tensors.items():
        match = _LAYER_TENSOR.fullmatch(name)
        if match:
            layers.add(int(match.group(1)))
            expected = per_layer.get(match.group(2))
        else:
            expected = whole_model.get(name)
        if expected is not None and tuple(tensor.shape) != expected:
            raise ModelLoadError(f"{source}: tensor {name} has shape {list(tensor.shape)}, the config implies {list(expected)}")
    if layers != set(range(config.num_layers)):
        raise ModelLoadError(
            f"{source}: the config says {config.num_layers} layers, the file has tensors for {len(layers)} "
            f"(numbered {min(layers, default=0)} to {max(layers, default=-1)})"
        )
