"""Paged KV block allocation: a fixed pool of blocks, one block table per sequence, reference counts.

Every block is in exactly one state: free (no reference, no cached contents), in use (referenced by one or more
block tables; shared blocks hold a prefix common to all their holders), or evictable (no reference, but its
contents are named in the prefix cache so a later request can reuse them). Fresh blocks come from the free list
first and from evicting the least recently used evictable block only when the free list is empty.

Pure bookkeeping: the model runner owns the KV tensors and writes block `b`'s tokens at slots
`b * block_size .. b * block_size + block_size - 1` of every layer's pool.
"""

import math
from collections import deque

from ridgeline.engine.prefix_cache import ROOT_HASH, PrefixCache, hash_block_tokens
from ridgeline.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_block_ids = deque(range(num_blocks))
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None

    @property
    def num_free_blocks(self) -> int:
        """Blocks a fresh allocation can take: free ones plus evictable cached ones."""
        evictable = self.prefix_cache.num_evictable if self.prefix_cache else 0
        return len(self.free_block_ids) + evictable

    @property
    def usage(self) -> float:
        """Fraction of the pool held by sequences (evictable cached blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached run of seq's leading full blocks; nothing is taken yet.

        Never the whole sequence: its last token must be computed so there are logits to sample from.
        """
        if self.prefix_cache is None:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in self._block_hashes(seq, max_blocks):
            block_id = self.prefix_cache.lookup(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int] | None = None) -> bool:
        """Grow seq's block table to cover its computed tokens, then `cached_blocks` (prefix-cache hits from
        find_cached_prefix, only for a sequence that holds no blocks yet), then num_new_tokens more.

        All or nothing: returns False, changing nothing, when the pool cannot supply the fresh blocks.
        """
        cached_blocks = cached_blocks or []
        if cached_blocks and (seq.block_table or seq.num_computed_tokens):
            raise ValueError(f"{seq.request_id}: cached blocks can only start an empty block table")
        num_covered = seq.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        num_fresh = max(0, self.num_blocks_for(num_covered) - len(seq.block_table) - len(cached_blocks))
        # A hit on an evictable block takes it out of the pool the fresh blocks are drawn from.
        num_revived = sum(1 for block_id in cached_blocks if self.ref_counts[block_id] == 0)
        if num_fresh > self.num_free_blocks - num_revived:
            return False
        for block_id in cached_blocks:
            self._add_reference(block_id)
        seq.block_table.extend(cached_blocks)
        seq.block_table.extend(self._take_fresh_block() for _ in range(num_fresh))
        return True

    def fork(self, parent: Sequence, child: Sequence) -> int:
        """Share with an empty child the parent's computed full blocks whose tokens the child also starts with
        (e.g. the prompt, for the n samples of one request). Returns how many of the child's tokens are thereby
        computed. Only full blocks are shared, so neither side ever writes into a block the other reads."""
        if child.block_table:
            raise ValueError(f"{child.request_id}: can only fork into a sequence that holds no blocks")
        bs = self.block_size
        # Like a cache hit, leave the child's last token to compute.
        limit = min(parent.num_computed_tokens, child.num_tokens - 1) // bs
        shared = 0
        while shared < limit and parent.token_ids[shared * bs : (shared + 1) * bs] == child.token_ids[shared * bs : (shared + 1) * bs]:
            shared += 1
        for block_id in parent.block_table[:shared]:
            self._add_reference(block_id)
        child.block_table.extend(parent.block_table[:shared])
        return shared * bs

    def free(self, seq: Sequence) -> None:
        """Drop seq's references. A block nobody holds goes to the evictable LRU if its contents are cached,
        else to the free list. Tail blocks are released first so they are evicted before the shared prefix."""
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                if self.prefix_cache is not None and self.prefix_cache.hash_of(block_id) is not None:
                    self.prefix_cache.park(block_id)
                else:
                    self.free_block_ids.append(block_id)
        seq.block_table.clear()

    def cache_blocks(self, seq: Sequence, start: int, end: int) -> None:
        """Tokens [start, end) of seq now have their KV written: name every block that this filled."""
        if self.prefix_cache is None:
            return
        first, last = start // self.block_size, end // self.block_size
        hashes = self._block_hashes(seq, last)
        for index in range(first, last):
            self.prefix_cache.insert(hashes[index], seq.block_table[index])

    def reset_prefix_cache(self) -> None:
        """Forget all cached contents (e.g. to measure a cold start); blocks in use stay with their sequences."""
        if self.prefix_cache is not None:
            self.free_block_ids.extend(self.prefix_cache.forget_all())

    def kv_manifest(self, seq: Sequence) -> list[tuple[int, bytes | None]]:
        """What moving seq's KV to another worker needs: each block id with the hash of its contents (None for
        a block not yet full and computed). The receiver allocates its own blocks and can name them by hash."""
        num_full = seq.num_computed_tokens // self.block_size
        hashes = self._block_hashes(seq, num_full)
        return [(block_id, hashes[i] if i < num_full else None) for i, block_id in enumerate(seq.block_table)]

    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """seq's chained block hashes for its first num_blocks full blocks (extending seq.block_hashes)."""
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash_block_tokens(hashes[-1] if hashes else ROOT_HASH, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes[:num_blocks]

    def _add_reference(self, block_id: int) -> None:
        if self.ref_counts[block_id] == 0:
            self.prefix_cache.unpark(block_id)  # only cached blocks can be hit with no reference
        self.ref_counts[block_id] += 1

    def _take_fresh_block(self) -> int:
        block_id = self.free_block_ids.popleft() if self.free_block_ids else self.prefix_cache.evict_lru()
        self.ref_counts[block_id] = 1
        return block_id
