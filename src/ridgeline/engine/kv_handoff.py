"""What an engine knows about handing a prefilled sequence's KV pages to another engine (disaggregated prefill
and decode): which pages a sequence holds, named by layer group, block and chain hash; how their bytes are read
and written; and the layout two engines must share for the bytes to mean the same thing.

Only pages a later query reads move: every block of a full-attention group, and only the window's blocks of a
sliding-window group, plus the one below it that a repeat of the prompt reads (see first_kept_block; the rest
were released on the prefill side and are never read on the decode side). Full
blocks carry their sha256 chain hash (engine/prefix_cache.py): the receiver recomputes it from the prompt it
was sent, so pages of another prompt are refused, and it skips blocks its own prefix cache already holds. The
last, partial block has no hash and always moves. How bytes travel is cluster/kv_transfer's business.
"""

import hashlib
from dataclasses import dataclass

import torch

from ridgeline.engine.block_manager import RELEASED, first_kept_block
from ridgeline.engine.kv_cache import KVCache
from ridgeline.errors import RidgelineError
from ridgeline.napkin.kv_dtypes import kv_dtype


class KVHandoffError(RidgelineError):
    """A KV handoff cannot go ahead (layouts differ, pages of another prompt, unknown or released request)."""


@dataclass(frozen=True)
class KVLayout:
    """Everything that decides what a page's bytes mean. Two engines exchange pages only when these agree."""

    model: str  # the model's identity: its name and a digest of its configuration and weights' shapes
    k_dtype: str  # a bf16 page and a q8_0 page of the same tokens differ in size and meaning: both are in the digest
    v_dtype: str
    block_size: int
    windows: tuple[int | None, ...]  # per layer group
    layers_per_group: int
    num_kv_heads: int
    head_dim: int

    @property
    def page_bytes(self) -> int:
        per_value = kv_dtype(self.k_dtype).bytes_per_value + kv_dtype(self.v_dtype).bytes_per_value  # K + V
        return int(self.layers_per_group * self.block_size * self.num_kv_heads * self.head_dim * per_value)

    def digest(self) -> str:
        """The compatibility hash the two sides compare in their handshake."""
        return hashlib.sha256(repr(self).encode()).hexdigest()


@dataclass(frozen=True)
class PageRef:
    """One page of a sequence's KV: layer group, block index, and the block's chain hash (None: partial block)."""

    group: int
    block: int
    chain_hash: bytes | None


@dataclass(frozen=True)
class KVManifest:
    """What a prefill side offers for one request: the prompt it computed, the first token it sampled, and the
    pages that hold the prompt's KV."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    first_token_id: int
    pages: tuple[PageRef, ...]
    layout_digest: str
    num_cached_tokens: int = 0  # prompt tokens the prefill side found in its prefix cache (reported as cached)


def pages_to_move(num_tokens: int, windows: tuple[int | None, ...], block_size: int,
                  hashes: list[bytes]) -> list[PageRef]:
    """The pages a sequence of num_tokens computed tokens needs on the decode side, group by group: for each
    group, the blocks from first_kept_block (the first one a repeat of the prompt there reads: its next query's
    first, or one lower) up to the last (partial) one."""
    num_blocks = -(-num_tokens // block_size)
    return [PageRef(group, block, hashes[block] if block < len(hashes) else None)
            for group, window in enumerate(windows)
            for block in range(first_kept_block(num_tokens, window, block_size), num_blocks)]


def page_tensors(kv_cache: KVCache, page: int) -> list[torch.Tensor]:
    """Views of one page's K and V in every layer of its group, one per cache tensor (K's, then V's; a Q8_0 side
    has its int8 values and fp16 scales): each [layers, block_size, ...]."""
    if page == RELEASED or not 0 <= page < kv_cache.num_pages:
        raise KVHandoffError(f"page {page} is not a page of this cache")
    bs = kv_cache.block_size
    return [tensor[:, page * bs:(page + 1) * bs] for tensor in kv_cache.tensors]


def read_page(kv_cache: KVCache, page: int) -> bytes:
    return b"".join(view.contiguous().view(torch.uint8).numpy().tobytes() for view in page_tensors(kv_cache, page))


def write_page(kv_cache: KVCache, page: int, payload: bytes) -> None:
    targets = page_tensors(kv_cache, page)
    sizes = [target.numel() * target.element_size() for target in targets]
    if len(payload) != sum(sizes):
        raise KVHandoffError(f"a page holds {sum(sizes)} bytes, {len(payload)} arrived")
    source = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    for target, part in zip(targets, source.split(sizes)):
        target.copy_(part.view(target.dtype).view(target.shape))


def payload_digest(payload: bytes) -> bytes:
    """sha256 of a page's bytes: what the receiver checks the bytes it got against."""
    return hashlib.sha256(payload).digest()
