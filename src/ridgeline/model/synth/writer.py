"""Write a random-weight GGUF of a catalogued model shape, tensor by tensor.

Every tensor's header goes first (the GGUF layout needs all of them before any data), then each tensor's bytes
are made and written a chunk of rows at a time: memory stays at one chunk whatever the model's size. Each tensor
draws from its own generator, seeded by the run's seed and the tensor's name, so the same options write the same
bytes, and a file cut to fewer layers holds the same first layers as the whole one.
"""

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, GGMLQuantizationType as T, RopeScalingType

from ridgeline.errors import RidgelineError
from ridgeline.model.synth.blocks import random_rows
from ridgeline.model.synth.plan import PlannedTensor, WeightsChoice, check_shape, tensor_plan, weights_choice
from ridgeline.model.synth.tokenizer import MIN_VOCAB, tokenizer_fields
from ridgeline.napkin.model_specs import MODEL_SPECS, ModelSpec, model_spec

CHUNK_BYTES = 32 << 20  # rows written per step: what the writer holds in memory at once


@dataclass(frozen=True)
class SynthOptions:
    shape: str  # a napkin catalogue name (ridgeline.napkin.model_specs.MODEL_SPECS)
    weights: str = "q4_k_m"
    layers: int | None = None  # cut the shape to its first N layers (None: all)
    seed: int = 0
    vocab: int | None = None  # cut (or pad) the vocabulary (None: the shape's)

    def resolved(self) -> tuple[ModelSpec, WeightsChoice, int, int]:
        if self.shape.lower() not in MODEL_SPECS:
            raise RidgelineError(f"unknown shape {self.shape!r} (catalogued: {', '.join(MODEL_SPECS)})")
        spec = model_spec(self.shape)
        check_shape(spec)
        choice = weights_choice(self.weights)
        if choice.experts is not None and not spec.num_experts:
            raise RidgelineError(f"{choice.name} quantises MoE experts, and {spec.name} has none")
        layers = spec.num_layers if self.layers is None else self.layers
        if not 1 <= layers <= spec.num_layers:
            raise RidgelineError(f"--layers must be between 1 and {spec.num_layers} for {spec.name}, not {layers}")
        vocab = spec.vocab_size if self.vocab is None else self.vocab
        if vocab < MIN_VOCAB:
            raise RidgelineError(f"a vocabulary of {vocab} tokens is too small for the borrowed tokenizer "
                                 f"(at least {MIN_VOCAB})")
        return spec, choice, layers, vocab

    @property
    def file_name(self) -> str:
        spec, choice, layers, vocab = self.resolved()
        cut = "" if layers == spec.num_layers else f"-l{layers}"
        cut += "" if vocab == spec.vocab_size else f"-v{vocab}"
        return f"synth-{spec.name}{cut}-seed{self.seed}.{choice.name.upper()}.gguf"


def _metadata(writer: GGUFWriter, spec: ModelSpec, choice: WeightsChoice, layers: int, vocab: int,
              options: SynthOptions) -> None:
    writer.add_name(f"synthetic {spec.name} ({choice.name}, seed {options.seed}, random weights)")
    writer.add_string("ridgeline.synth.shape", spec.name)
    writer.add_uint32("ridgeline.synth.seed", options.seed)
    writer.add_block_count(layers)
    writer.add_context_length(spec.max_context)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_head_count(spec.num_heads)
    writer.add_head_count_kv(spec.num_kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_norm_eps)
    writer.add_vocab_size(vocab)
    writer.add_file_type(int(choice.file_type))
    if spec.num_experts:
        writer.add_expert_count(spec.num_experts)
        writer.add_expert_used_count(spec.experts_per_token)
        writer.add_expert_feed_forward_length(spec.intermediate_size)
    if spec.sliding_window:
        writer.add_sliding_window(spec.sliding_window)
    if spec.yarn is not None:
        factor, original = spec.yarn
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(factor)
        writer.add_rope_scaling_orig_ctx_len(original)
    for field in tokenizer_fields(vocab):
        writer.add_key_value(field.key, field.value, field.vtype, field.sub_type)


def _nbytes(tensor: PlannedTensor) -> int:
    *outer, columns = tensor.shape
    if tensor.qtype in (T.F32, T.F16):
        return int(np.prod(tensor.shape)) * (4 if tensor.qtype == T.F32 else 2)
    block_size, block_bytes = GGML_QUANT_SIZES[tensor.qtype]
    return int(np.prod(outer)) * columns // block_size * block_bytes


def _chunks(tensor: PlannedTensor, rng: np.random.Generator):
    """The tensor's data as arrays of whole rows, in file order."""
    if tensor.kind == "norm":
        yield np.ones(tensor.shape, np.float32)
        return
    if tensor.kind == "vector":
        yield rng.standard_normal(tensor.shape, dtype=np.float32) * np.float32(tensor.std)
        return
    *outer, columns = tensor.shape
    rows = int(np.prod(outer))
    step = max(1, CHUNK_BYTES // (_nbytes(tensor) // rows))
    for start in range(0, rows, step):
        yield random_rows(tensor.qtype, min(step, rows - start), columns, tensor.std, rng)


def write_synth(path: str | Path, options: SynthOptions, progress: Callable[[int, int], None] | None = None) -> Path:
    """Write the model to `path`; `progress(bytes done, bytes in all)` after each chunk."""
    spec, choice, layers, vocab = options.resolved()
    plan = tensor_plan(spec, choice, layers, vocab)
    path = Path(path)
    writer = GGUFWriter(str(path), spec.architecture)
    _metadata(writer, spec, choice, layers, vocab, options)
    for tensor in plan:
        nbytes = _nbytes(tensor)
        if tensor.qtype in (T.F32, T.F16):
            writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(np.float32 if tensor.qtype == T.F32 else np.float16),
                                   nbytes)
        else:
            byte_shape = (*tensor.shape[:-1], nbytes // int(np.prod(tensor.shape[:-1])))
            writer.add_tensor_info(tensor.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=tensor.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total, done = sum(_nbytes(t) for t in plan), 0
    (out,) = writer.fout  # one file: the writer splits only when asked to
    for tensor in plan:
        rng = np.random.default_rng([options.seed, zlib.crc32(tensor.name.encode())])
        writer.write_padding(out, out.tell())
        for chunk in _chunks(tensor, rng):
            chunk.tofile(out)
            done += chunk.nbytes
            if progress is not None:
                progress(done, total)
        writer.write_padding(out, _nbytes(tensor))
    writer.close()
    return path


def synth_file(directory: str | Path, options: SynthOptions,
               progress: Callable[[int, int], None] | None = None) -> Path:
    """The model in `directory` under a name naming every option, written on first use (to a .partial file renamed
    when complete, so an interrupted write is never taken for a model)."""
    directory = Path(directory)
    target = directory / options.file_name
    if not target.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        write_synth(partial, options, progress)
        partial.rename(target)
    return target


def cache_dir() -> Path:
    """Where `bench latency --shape` keeps the files it synthesises: beside the compiled kernels' cache."""
    from ridgeline.model.native import CACHE_DIR

    return CACHE_DIR / "synth"
