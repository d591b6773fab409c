"""Exact prefix-cache affinity: which replica already holds how much of a prompt's KV.

Workers publish the sha256 chain hashes of the blocks they gain and lose (engine/prefix_cache.py names a block
by the hash of its parent's hash and its token ids, so one hash stands for the whole prefix up to it). The
router hashes a prompt the same way and walks the chain: the first hash a replica lacks ends its cached prefix.
Exact, not a guess from an approximate tree: a hit here is a block the worker's own lookup would find, unless it
was evicted after the last report.
"""

from ridgeline.cluster.messages import CacheEvents
from ridgeline.engine.prefix_cache import ROOT_HASH, hash_block_tokens


def prompt_block_hashes(token_ids: list[int], block_size: int) -> list[bytes]:
    """The chain hashes of the prompt's blocks a worker could reuse: full blocks, never the last token's (the
    engine always computes the last token, to have logits to sample from)."""
    hashes: list[bytes] = []
    parent = ROOT_HASH
    for block in range((len(token_ids) - 1) // block_size):
        parent = hash_block_tokens(parent, token_ids[block * block_size : (block + 1) * block_size])
        hashes.append(parent)
    return hashes


class PrefixIndex:
    """Block hashes held by each replica, kept current from the workers' CacheEvents."""

    def __init__(self) -> None:
        self._held: dict[str, set[bytes]] = {}

    def apply(self, replica: str, events: CacheEvents) -> None:
        held = self._held.setdefault(replica, set())
        if events.cleared:
            held.clear()
        held.difference_update(events.removed)
        held.update(events.stored)

    def forget(self, replica: str) -> None:
        """A replica that died or left holds nothing any more."""
        self._held.pop(replica, None)

    def cached_blocks(self, replica: str, hashes: list[bytes]) -> int:
        """Leading blocks of the chain the replica holds."""
        held = self._held.get(replica)
        if not held:
            return 0
        for count, block_hash in enumerate(hashes):
            if block_hash not in held:
                return count
        return len(hashes)

    def match(self, replicas: list[str], token_ids: list[int], block_size: int) -> dict[str, int]:
        """Cached prompt tokens per replica. Hashes the prompt block by block only while some replica still holds
        the chain, so a long prompt nobody has cached costs one hash, not one per block (the router's hot path)."""
        matched = dict.fromkeys(replicas, 0)
        alive = [name for name in replicas if self._held.get(name)]
        parent = ROOT_HASH
        for block in range((len(token_ids) - 1) // block_size):
            if not alive:
                break
            parent = hash_block_tokens(parent, token_ids[block * block_size : (block + 1) * block_size])
            alive = [name for name in alive if parent in self._held[name]]
            for name in alive:
                matched[name] = (block + 1) * block_size
        return matched

    def num_blocks(self, replica: str) -> int:
        return len(self._held.get(replica, ()))
