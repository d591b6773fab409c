"""What the dashboard shows about one engine besides its steps: queue and KV cache, read on the engine thread.

The engine is not thread-safe, so `engine_view` is called by the thread that steps it (between steps) and
returns frozen data that any thread may read.
"""

from dataclasses import asdict, dataclass

from ridgeline.engine.block_manager import RELEASED, pages_held


@dataclass(frozen=True)
class GroupPages:
    window: int | None  # None: full attention
    layers: int
    used: int  # distinct pages this group's block tables hold


@dataclass(frozen=True)
class EngineView:
    num_running: int
    num_waiting: int
    free_pages: int  # free plus evictable cached pages, as the engine counts them
    total_pages: int
    groups: tuple[GroupPages, ...]
    block_size: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    preemptions: int
    mean_context: float | None  # over running sequences, else the last decode step's; None before any
    pages_per_sequence: int | None  # what one more sequence at the mean context would hold
    largest_batch: int | None  # running + as many more at the mean context as the free pages hold

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def to_json(self) -> dict:
        return asdict(self) | {"prefix_hit_rate": self.prefix_hit_rate, "used_pages": self.total_pages - self.free_pages}


def engine_view(engine) -> EngineView:
    """A snapshot of `engine` (an LLMEngine); costs one pass over the running sequences' block tables."""
    stats = engine.stats()
    scheduler = engine.scheduler
    blocks = scheduler.block_manager
    windows = blocks.windows
    running = list(scheduler.running)
    used = [set() for _ in windows]
    for seq in running:
        for pages, table in zip(used, seq.block_tables):
            pages.update(table)
    layers_per_group = engine.model_config.num_layers // len(windows)
    groups = tuple(GroupPages(window, layers_per_group, len(pages - {RELEASED})) for window, pages in zip(windows, used))
    mean_context = sum(seq.num_tokens for seq in running) / len(running) if running else last_decode_context(engine)
    per_seq = largest = None
    if mean_context is not None:
        context = round(mean_context)
        per_seq = sum(pages_held(context, 1, window, blocks.block_size) for window in windows)
        largest = len(running) + stats.num_free_pages // per_seq
    return EngineView(stats.num_running, stats.num_waiting, stats.num_free_pages, stats.num_total_pages, groups,
                      blocks.block_size, stats.prefix_cache_queries, stats.prefix_cache_hits, stats.num_preemptions,
                      mean_context, per_seq, largest)


def last_decode_context(engine) -> float | None:
    """When nothing runs, the batch the pool allows is still worth showing: at the context traffic last had."""
    for step in reversed(engine.steps.recent(limit=64)):
        if step.decode_contexts:
            return sum(step.decode_contexts) / len(step.decode_contexts)
    return None

