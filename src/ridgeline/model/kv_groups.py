"""How a model's layers share KV block tables: layers with the same attention window form equal-sized groups.

A sliding-window layer never reads keys older than its window, so its blocks can be released as the sequence
moves on, while a full-attention layer keeps every block. Layers of one window therefore share a block table,
and the groups are cut to one size so that a page (block_size tokens of K and V of a group's layers) has the
same bytes in every group and all groups draw on one pool. Gemma 3 270M: 3 full-attention layers and 15
sliding ones give 6 groups of 3 (1 full, 5 sliding), so past the window a token costs 3 layers' KV, not 18.
"""

import math
from dataclasses import dataclass

from ridgeline.model.config import ModelConfig


@dataclass(frozen=True)
class LayerGroup:
    window: int | None  # None = full attention: no block is ever released before the sequence ends
    layers: tuple[int, ...]


def layer_groups(model: ModelConfig) -> tuple[LayerGroup, ...]:
    """Full-attention groups first, then sliding-window ones, each a run of equally many layers."""
    full = tuple(i for i in range(model.num_layers) if not model.is_sliding(i))
    sliding = tuple(i for i in range(model.num_layers) if model.is_sliding(i))
    size = math.gcd(len(full), len(sliding))  # gcd(n, 0) = n: one group when no layer slides
    return tuple(LayerGroup(window, layers[start:start + size])
                 for window, layers in ((None, full), (model.sliding_window, sliding))
                 for start in range(0, len(layers), size))
