"""One way to build a runnable model: checkpoint -> Transformer -> paged KV cache -> ModelRunner.

The engine, `ridgeline perplexity`, `ridgeline bench latency` and the tests all need the same assembly; they differ
only in the weight options, the cache's dtype and how many pages it holds (a memory budget for the engine, a
fixed number of blocks for one sequence elsewhere).
"""

from dataclasses import dataclass
from pathlib import Path

from ridgeline.engine.kv_cache import KVCache, KVCacheConfig, pages_for_budget
from ridgeline.engine.model_runner import ModelRunner
from ridgeline.model.checkpoint import Checkpoint, read_checkpoint, release_loader_memory
from ridgeline.model.config import ModelConfig
from ridgeline.model.tokenizer import Tokenizer
from ridgeline.model.transformer import ModelOptions, Transformer
from ridgeline.startup_clock import phase


@dataclass
class AssembledModel:
    name: str
    config: ModelConfig
    tokenizer: Tokenizer | None  # None unless asked for
    runner: ModelRunner

    @property
    def model(self) -> Transformer:
        return self.runner.model

    @property
    def kv_cache(self) -> KVCache:
        return self.runner.kv_cache


def assemble_model(source: str | Path | Checkpoint | None, options: ModelOptions = ModelOptions(),
                   cache: KVCacheConfig = KVCacheConfig(), *, num_blocks: int | None = None,
                   tokenizer: bool = False) -> AssembledModel:
    """Build the model from `source` (a path, None for the bundled default, or an open Checkpoint to reuse).

    The KV cache holds as many pages as `cache.memory_bytes` pays for, or, with `num_blocks`, a page in every
    layer group for each of `num_blocks` blocks (one sequence of num_blocks * block_size tokens, see
    KVCache.group_tables). A checkpoint opened here is dropped once the model is built and the loader's heap is
    returned to the OS; one passed in belongs to the caller, who may build from it again.
    """
    opened = not isinstance(source, Checkpoint)
    with phase("load weights"):
        checkpoint = read_checkpoint(source) if opened else source
    name, config = checkpoint.name, checkpoint.config
    with phase("tokenizer"):
        loaded_tokenizer = checkpoint.load_tokenizer() if tokenizer else None
    with phase("load weights"):
        model = Transformer(checkpoint, options)
        if opened:
            del checkpoint
            release_loader_memory()
    device = model.options.device
    with phase("KV alloc"):
        if num_blocks is None:
            kv_cache = KVCache(config, cache, pages_for_budget(config, cache), device)
        else:
            kv_cache = KVCache.for_blocks(config, cache, num_blocks, device)
    return AssembledModel(name, config, loaded_tokenizer, ModelRunner(model, kv_cache))
