"""An EngineConfig from the flat settings a command takes (`serve`, `generate`, a worker, a cluster's replicas).

Engine configuration belongs to the engine: the commands (cli/), the workers a front starts (server/worker_server.py)
and the replicas a cluster builds (cluster/) all read their settings through here, so none reaches up into cli/.
"""

from pathlib import Path
from typing import TYPE_CHECKING

from ridgeline.errors import RidgelineError

if TYPE_CHECKING:
    from ridgeline.engine.llm_engine import EngineConfig
    from ridgeline.engine.scheduler import ItlTarget

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_itl_target(text: str) -> "ItlTarget | None":
    """'auto', a number of milliseconds, or '0'/'off' (no target: the fixed token budget)."""
    from ridgeline.engine.scheduler import ItlTarget

    cleaned = text.strip().lower()
    if cleaned == "auto":
        return ItlTarget()
    if cleaned in ("off", "none"):
        return None
    try:
        milliseconds = float(cleaned)
    except ValueError:
        milliseconds = float("nan")
    if not milliseconds >= 0 or milliseconds == float("inf"):
        raise RidgelineError(f"--itl-target-ms takes a number of milliseconds, auto, or 0 (off), got {text!r}")
    return ItlTarget(seconds=milliseconds / 1e3) if milliseconds else None


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
                  kv_cache_memory: str = "2GiB", kv_cache_dtype: str = "bf16", kv_cache_dtype_k: str | None = None,
                  kv_cache_dtype_v: str | None = None, block_size: int = 16,
                  max_num_seqs: int = 256, max_num_batched_tokens: int = 2048, prefix_caching: bool = True,
                  chunked_prefill: bool = True, max_model_len: int | None = None,
                  speculative_tokens: int = 0, itl_target: "ItlTarget | None" = None,
                  priority_aging_steps: int | None = None) -> "EngineConfig":
    # Imported here: the command modules import this one as they load for `ridgeline --help`, which needs no torch.
    from ridgeline.engine.kv_cache import KVCacheConfig
    from ridgeline.engine.llm_engine import EngineConfig
    from ridgeline.engine.scheduler import SchedulerConfig
    from ridgeline.engine.speculative import SpeculativeConfig

    return EngineConfig(
        model=str(model) if model is not None else None,
        dtype=dtype,
        lm_head=lm_head,
        threads=threads,
        kv_cache=KVCacheConfig(block_size, kv_cache_dtype, parse_bytes(kv_cache_memory), kv_cache_dtype_k,
                               kv_cache_dtype_v),
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                  enable_prefix_caching=prefix_caching, enable_chunked_prefill=chunked_prefill,
                                  itl_target=itl_target, priority_aging_steps=priority_aging_steps),
        max_model_len=max_model_len,
        speculative=SpeculativeConfig(num_tokens=speculative_tokens),
    )
