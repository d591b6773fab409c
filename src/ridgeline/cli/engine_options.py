"""Engine settings shared by the commands that run a model."""

from pathlib import Path
from typing import TYPE_CHECKING

from ridgeline.errors import RidgelineError

if TYPE_CHECKING:
    from ridgeline.engine.llm_engine import EngineConfig

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_bytes(text: str) -> int:
    """'2GiB', '512M', '1.5g' or plain bytes."""
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if cleaned and cleaned[-1] in UNITS:
            return int(float(cleaned[:-1]) * UNITS[cleaned[-1]])
        return int(cleaned)
    except ValueError:
        raise RidgelineError(f"cannot read {text!r} as a size (e.g. 2GiB, 512MiB)") from None


def engine_config(model: Path | None, *, threads: int | None = None, dtype: str = "float32", lm_head: str = "keep",
                  kv_cache_memory: str = "2GiB", kv_cache_dtype: str = "bf16", block_size: int = 16,
                  max_num_seqs: int = 256, max_num_batched_tokens: int = 2048, prefix_caching: bool = True,
                  chunked_prefill: bool = True, max_model_len: int | None = None,
                  speculative_tokens: int = 0) -> "EngineConfig":
    # Imported here: the command modules that import this one load for `ridgeline --help`, which needs no torch.
    from ridgeline.engine.kv_cache import KVCacheConfig
    from ridgeline.engine.llm_engine import EngineConfig
    from ridgeline.engine.scheduler import SchedulerConfig
    from ridgeline.engine.speculative import SpeculativeConfig

    return EngineConfig(
        model=str(model) if model is not None else None,
        dtype=dtype,
        lm_head=lm_head,
        threads=threads,
        kv_cache=KVCacheConfig(block_size, kv_cache_dtype, parse_bytes(kv_cache_memory)),
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                  enable_prefix_caching=prefix_caching, enable_chunked_prefill=chunked_prefill),
        max_model_len=max_model_len,
        speculative=SpeculativeConfig(num_tokens=speculative_tokens),
    )
