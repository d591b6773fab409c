"""One way for the roofline, advise and bench tools to get a model's shape: a built-in spec by name, or a real
checkpoint by path. It lives beside the benchmarks rather than in napkin/ because it opens checkpoints."""

from pathlib import Path
from typing import TYPE_CHECKING

from ridgeline.errors import ModelLoadError, RidgelineError
from ridgeline.napkin.model_shape import NO_WEIGHTS, ModelShape, WeightGroup
from ridgeline.napkin.model_specs import MODEL_SPECS, model_spec

if TYPE_CHECKING:
    from ridgeline.model.checkpoint import Checkpoint

EMBEDDING = "token_embd.weight"
LM_HEAD = "output.weight"


def load_model_shape(model: str | None, weights: str | None = None) -> ModelShape:
    """`model`: a GGUF file or HF directory (None: the bundled default), or a built-in spec name.

    `weights` picks a spec's format (default: the format it is released in); a file is measured as stored.
    """
    if model is not None and model.lower() in MODEL_SPECS and not Path(model).exists():
        return model_spec(model).shape(weights)
    if weights is not None:
        raise RidgelineError(f"--weights applies to built-in specs ({', '.join(MODEL_SPECS)}); a file is read as stored")
    if model is not None and model != "smollm2" and not Path(model).expanduser().exists():  # (read_checkpoint's name
        # for the second real model, found in its package; not imported here: model code pulls in torch)
        raise ModelLoadError(f"model not found: {model!r} is neither a file nor a built-in spec ({', '.join(MODEL_SPECS)})")
    from ridgeline.model.checkpoint import read_checkpoint  # only for a file: a spec's shape needs no model code

    return shape_from_checkpoint(read_checkpoint(model))


def shape_from_checkpoint(checkpoint: "Checkpoint") -> ModelShape:
    """Group the file's real tensors by how a decode step reads them (see ModelShape)."""
    config = checkpoint.config
    tensors = checkpoint.tensors

    def group(names: list[str]) -> WeightGroup:
        return sum((WeightGroup(tensors[n].numel, tensors[n].nbytes) for n in names), NO_WEIGHTS)

    embedding = group([EMBEDDING])
    lm_head = embedding if config.tie_word_embeddings else group([LM_HEAD])
    # MoE experts (GGUF's *_exps tensors): a decode step reads only the routed ones
    experts = [n for n in tensors if "_exps." in n]
    window = config.sliding_window
    matmuls = [n for n in tensors if n != EMBEDDING or config.tie_word_embeddings]
    integer_bytes = sum(tensors[n].nbytes for n in matmuls if tensors[n].is_quantized)
    return ModelShape(
        name=checkpoint.name,
        weights="as stored",
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_context=config.max_context,
        embedding=embedding,
        lm_head=lm_head,
        dense=group([n for n in tensors if n not in (EMBEDDING, LM_HEAD) and "_exps." not in n]),
        experts=group(experts),
        num_experts=config.num_experts,
        experts_per_token=config.experts_per_token,
        tied_embeddings=config.tie_word_embeddings,
        sliding_window=window,
        num_sliding_layers=len(config.sliding_layers) if window else 0,
        # Most matmul bytes in quantised blocks: the matmuls run as int8 on the compiled kernels
        integer_weights=integer_bytes > sum(tensors[n].nbytes for n in matmuls) / 2,
    )
