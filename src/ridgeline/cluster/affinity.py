"""Exact prefix-cache affinity: which replica already holds how much of a prompt's KV.

Workers publish the sha256 chain hashes of the blocks they gain and lose (engine/prefix_cache.py names a block
by the hash of its parent's hash and its token ids, so one hash stands for the whole prefix up to it). The
router hashes a prompt the same way and walks the chain: the first hash a replica lacks ends its cached prefix.
Exact, not a guess from an approximate tree: a hit here is a block the worker's own lookup would find, unless it
was evicted after the last report.

Like load, a prefix is also counted at dispatch: the blocks of a prompt just sent to a replica are *expected* there
until the worker's first report after the request ends has had the chance to confirm them. Without that, the
next turn on the same prefix, sent while the first still prefills, sees no replica holding it, goes wherever load
says, and copies the prefix to a second replica where it evicts others.
"""

from collections import Counter

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
        self._expected: dict[str, Counter] = {}  # replica -> block hash -> requests in flight that bring it
        self._requests: dict[str, tuple[str, list[bytes]]] = {}  # request id -> replica, its prompt's hashes
        self._ended: dict[str, list[str]] = {}  # replica -> ended requests whose blocks its next report confirms
        self._pending: dict[str, int] = {}  # replica -> expected blocks not (yet) reported held

    def apply(self, replica: str, events: CacheEvents) -> None:
        held = self._held.setdefault(replica, set())
        if events.cleared:
            held.clear()
        held.difference_update(events.removed)
        held.update(events.stored)
        for request_id in self._ended.pop(replica, []):
            self._drop(request_id)
        self._pending[replica] = sum(1 for block_hash in self._expected.get(replica, ()) if block_hash not in held)

    def expect(self, replica: str, request_id: str, hashes: list[bytes]) -> None:
        """A prompt with these block hashes was just sent to `replica`: count them there from now on."""
        self._requests[request_id] = (replica, hashes)
        expected, held = self._expected.setdefault(replica, Counter()), self._held.get(replica, ())
        self._pending[replica] = self._pending.get(replica, 0) + sum(
            1 for block_hash in hashes if not expected[block_hash] and block_hash not in held)
        expected.update(hashes)

    def ended(self, request_id: str) -> None:
        """The request is over: its blocks stay expected until its replica's next report says what it kept."""
        if request_id in self._requests:
            self._ended.setdefault(self._requests[request_id][0], []).append(request_id)

    def _drop(self, request_id: str) -> None:
        replica, hashes = self._requests.pop(request_id, (None, []))
        expected = self._expected.get(replica)
        if expected is not None:
            expected.subtract(hashes)
            held = self._held.get(replica, ())
            for block_hash in hashes:
                if expected[block_hash] <= 0:
                    del expected[block_hash]
                    if block_hash not in held:
                        self._pending[replica] -= 1

    def forget(self, replica: str) -> None:
        """A replica that died or left holds nothing any more."""
        self._held.pop(replica, None)
        self._expected.pop(replica, None)
        self._ended.pop(replica, None)
        self._pending.pop(replica, None)
        for request_id in [r for r, (name, _) in self._requests.items() if name == replica]:
            del self._requests[request_id]

    def _holds(self, replica: str, block_hash: bytes) -> bool:
        return block_hash in self._held.get(replica, ()) or block_hash in self._expected.get(replica, ())

    def cached_blocks(self, replica: str, hashes: list[bytes]) -> int:
        """Leading blocks of the chain the replica holds."""
        for count, block_hash in enumerate(hashes):
            if not self._holds(replica, block_hash):
                return count
        return len(hashes)

    def match(self, replicas: list[str], token_ids: list[int], block_size: int) -> dict[str, int]:
        """Cached prompt tokens per replica. Hashes the prompt block by block only while some replica still holds
        the chain, so a long prompt nobody has cached costs one hash, not one per block (the router's hot path)."""
        matched = dict.fromkeys(replicas, 0)
        alive = [name for name in replicas if self._held.get(name) or self._expected.get(name)]
        parent = ROOT_HASH
        for block in range((len(token_ids) - 1) // block_size):
            if not alive:
                break
            parent = hash_block_tokens(parent, token_ids[block * block_size : (block + 1) * block_size])
            alive = [name for name in alive if self._holds(name, parent)]
            for name in alive:
                matched[name] = (block + 1) * block_size
        return matched

    def num_blocks(self, replica: str) -> int:
        return len(self._held.get(replica, ()))

    def blocks_in_use(self, replica: str) -> int:
        """Blocks the replica's cache holds as best the router knows: reported, and sent there since (expected)."""
        return len(self._held.get(replica, ())) + self._pending.get(replica, 0)
