"""The KV page pool a simulated replica gets: the engine's own layer grouping and page arithmetic, applied to a
model shape (a catalogue spec or a file) instead of a loaded model."""

from dataclasses import dataclass

from ridgeline.errors import RidgelineError
from ridgeline.model.kv_groups import layer_groups
from ridgeline.napkin.model_shape import ModelShape


@dataclass(frozen=True)
class _LayerPattern:
    """What model.kv_groups.layer_groups reads from a ModelConfig. Which layers slide does not change the
    groups (only how many do), so the sliding ones are taken to be the first."""

    num_layers: int
    sliding_window: int | None
    num_sliding: int

    def is_sliding(self, layer: int) -> bool:
        return layer < self.num_sliding


@dataclass(frozen=True)
class KVPool:
    num_pages: int
    windows: tuple[int | None, ...]  # per layer group
    page_bytes: float
    memory_bytes: float
    block_size: int

    @property
    def tokens_of_all_layers(self) -> int:
        return self.num_pages // len(self.windows) * self.block_size


def kv_pool(shape: ModelShape, memory_bytes: float, block_size: int, kv_dtype_bytes: float) -> KVPool:
    pattern = _LayerPattern(shape.num_layers, shape.sliding_window, shape.num_sliding_layers if shape.sliding_window else 0)
    groups = layer_groups(pattern)
    per_layer_token = shape.kv_bytes_per_token(kv_dtype_bytes) / shape.num_layers
    page_bytes = per_layer_token * len(groups[0].layers) * block_size
    num_pages = int(memory_bytes // page_bytes)
    if num_pages < len(groups):
        raise RidgelineError(f"a KV budget of {memory_bytes / 1e9:.3g} GB holds not even one {block_size}-token block "
                             f"in every layer of {shape.name} (the weights may not fit the machine)")
    return KVPool(num_pages, tuple(g.window for g in groups), page_bytes, memory_bytes, block_size)
