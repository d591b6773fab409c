"""What an engine knows about handing a prefilled sequence's KV pages to another engine (disaggregated prefill
and decode): which pages a sequence holds, named by layer group, block and chain hash; how their bytes are read
and written; and the layout two engines must share for the bytes to mean the same thing.

Only pages a later query reads move: every block of a full-attention group, and only the window's blocks of a
sliding-window group (the rest were released on the prefill side and are never read on the decode side). Full
blocks carry their sha256 chain hash (engine/prefix_cache.py): the receiver recomputes it from the prompt it
was sent, so pages of another prompt are refused, and it skips blocks its own prefix cache already holds. The
last, partial block has no hash and always moves. How bytes travel is cluster/kv_transfer's business.
"""

import hashlib
from dataclasses import dataclass

import torch

from ridgeline.engine.block_manager import RELEASED, first_readable_block
from ridgeline.engine.kv_cache import KVCache
from ridgeline.errors import RidgelineError


class KVHandoffError(RidgelineError):
    """A KV handoff cannot go ahead (layouts differ, pages of another prompt, unknown or released request)."""


@dataclass(frozen=True)
class KVLayout:
    """Everything that decides what a page's bytes mean. Two engines exchange pages only when these agree."""

    model: str  # the model's identity: its name and a digest of its configuration and weights' shapes
    kv_dtype: str
    block_size: int
    windows: tuple[int | None, ...]  # per layer group
    layers_per_group: int
    num_kv_heads: int
    head_dim: int

    @property
    def page_bytes(self) -> int:
        itemsize = torch.empty(0, dtype=_DTYPES[self.kv_dtype]).element_size()
        return self.layers_per_group * 2 * self.block_size * self.num_kv_heads * self.head_dim * itemsize

    def digest(self) -> str:
        """The compatibility hash the two sides compare in their handshake."""
        return hashlib.sha256(repr(self).encode()).hexdigest()


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


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
    group, the blocks from the first one its next query reads up to the last (partial) one."""
    num_blocks = -(-num_tokens // block_size)
    return [PageRef(group, block, hashes[block] if block < len(hashes) else None)
            for group, window in enumerate(windows)
            for block in range(first_readable_block(num_tokens, window, block_size), num_blocks)]


def page_tensor(kv_cache: KVCache, page: int) -> torch.Tensor:
    """A view of one page's K and V in every layer of its group: [layers, 2, block_size, kv_heads, head_dim]."""
    if page == RELEASED or not 0 <= page < kv_cache.num_pages:
        raise KVHandoffError(f"page {page} is not a page of this cache")
    bs = kv_cache.block_size
    return kv_cache.data[:, :, page * bs:(page + 1) * bs]


def read_page(kv_cache: KVCache, page: int) -> bytes:
    return page_tensor(kv_cache, page).contiguous().view(torch.uint8).numpy().tobytes()


def write_page(kv_cache: KVCache, page: int, payload: bytes) -> None:
    target = page_tensor(kv_cache, page)
    expected = target.numel() * target.element_size()
    if len(payload) != expected:
        raise KVHandoffError(f"a page holds {expected} bytes, {len(payload)} arrived")
    source = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(target.dtype).view(target.shape)
    target.copy_(source)


def payload_digest(payload: bytes) -> bytes:
    """sha256 of a page's bytes: what the receiver checks the bytes it got against."""
    return hashlib.sha256(payload).digest()
