"""How the engine's forward pass actually spends a step's rows on the machine it runs on.

The napkin counts work per row. Without the compiled kernels (a CPU without AVX-512 VNNI) the engine does more:
its matmuls run in zero-padded tiles of a fixed size per kind of row (model/quant/quantized_linear.py,
tiled_matmul, kept so every row's bits are batch-invariant), so a decode step of 9 rows costs two 8-row tiles
and a 65-token prompt two 64-row tiles; and its attention (attention_kernel.py, the torch path) runs one masked
SDPA per chunk over every key from the chunk's first attended position, so a prompt chunk pays the full
(rows x keys) rectangle in every layer, sliding-window ones included. Every chunk also computes one LM-head row
(its last), sampled or not. A step-time model fitted to measured steps needs these shapes as its terms, or a
straight line through the staircase misses both ends of it.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class EnginePath:
    decode_tile: int = 1  # rows of generated tokens go through the matmuls in tiles of this many
    prompt_tile: int = 1  # ... rows of prompt tokens
    logit_tile: int = 1  # ... LM-head rows
    chunk_span_attention: bool = False  # True: each chunk's rows attend the whole key span of the chunk (torch path)
    logits_every_chunk: bool = False  # True: every chunk computes one LM-head row, not only those that sample

    @staticmethod
    def tiles(rows: int, tile: int) -> int:
        return -(-rows // tile)

    @classmethod
    def from_settings(cls, settings: dict) -> "EnginePath":
        return cls(**settings.get("engine_path", {}))


NAPKIN = EnginePath()  # work counted per row, as the roofline does


def of_this_engine() -> EnginePath:
    """The path this process's engine takes: the compiled kernels' per-row work, or the torch fallback's tiles."""
    from ridgeline.model.native import compiled
    from ridgeline.model.quant.quantized_linear import DECODE_TILE_ROWS, PROMPT_TILE_ROWS

    if compiled() is not None:
        return EnginePath(logits_every_chunk=True)
    # The LM head always takes the decode (memory-bound) path: its rows go through in decode tiles.
    return EnginePath(DECODE_TILE_ROWS, PROMPT_TILE_ROWS, DECODE_TILE_ROWS, chunk_span_attention=True,
                      logits_every_chunk=True)
