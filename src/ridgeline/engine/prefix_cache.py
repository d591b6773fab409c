"""Hash-chained prefix cache: which KV block holds which full block of tokens, and which free ones to evict first.

A full block is named by sha256(parent block's hash || its token ids). Chaining makes the name stand for the
whole prefix up to and including the block, so one dict lookup per block finds the longest cached prefix, and
two requests share a block only if every earlier token matched too (attention at those positions saw the same
context). sha256 rather than Python's hash(): it is the same in every process and on every machine (a
prefill worker and a decode worker must agree on names when blocks move between them), and a collision, which
would silently hand one request another's KV, is out of reach (2**-128 by the birthday bound) even for
adversarial prompts, where a 64-bit hash can be attacked.
"""

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence

ROOT_HASH = b""  # the parent of a sequence's first block


def hash_block_tokens(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
    # Fixed-width little-endian ids: the bytes do not depend on the machine, and no two id lists share a byte string.
    return hashlib.sha256(parent_hash + struct.pack(f"<{len(token_ids)}q", *token_ids)).digest()


class PrefixCache:
    """Maps block hashes to block ids, keeps unreferenced cached blocks in LRU order, and counts hits.

    A cached block is either in use (referenced by some sequence; the block manager counts references) or
    evictable (reference count 0: kept for future hits, but reclaimed, least recently used first, as soon as a
    fresh block is needed).
    """

    def __init__(self) -> None:
        self._block_by_hash: dict[bytes, int] = {}
        self._hash_by_block: dict[int, bytes] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.num_query_tokens = 0
        self.num_hit_tokens = 0

    def lookup(self, block_hash: bytes) -> int | None:
        return self._block_by_hash.get(block_hash)

    def hash_of(self, block_id: int) -> bytes | None:
        return self._hash_by_block.get(block_id)

    def insert(self, block_hash: bytes, block_id: int) -> None:
        """Name an in-use block by its contents; a hash already cached keeps its first block (the newer copy stays
        unnamed and goes back to the free list when released)."""
        if block_hash not in self._block_by_hash and block_id not in self._hash_by_block:
            self._block_by_hash[block_hash] = block_id
            self._hash_by_block[block_id] = block_hash

    def park(self, block_id: int) -> None:
        """A cached block's last reference is gone: keep it for hits, most recently used."""
        self._evictable[block_id] = None

    def unpark(self, block_id: int) -> None:
        """A hit took an evictable block back into use."""
        del self._evictable[block_id]

    def is_evictable(self, block_id: int) -> bool:
        return block_id in self._evictable

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def evict_lru(self) -> int:
        """Forget the least recently used evictable block's contents and hand the block back for reuse."""
        block_id, _ = self._evictable.popitem(last=False)
        del self._block_by_hash[self._hash_by_block.pop(block_id)]
        return block_id

    def forget_all(self) -> list[int]:
        """Drop every name (no later hits); return the evictable blocks, which are now plain free blocks."""
        evicted = list(self._evictable)
        self._evictable.clear()
        self._block_by_hash.clear()
        self._hash_by_block.clear()
        return evicted

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.num_query_tokens += num_query_tokens
        self.num_hit_tokens += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        """Token-level: the fraction of admitted tokens whose prefill the cache skipped."""
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0
