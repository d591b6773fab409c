"""Hash-chained prefix cache: which KV page holds which full block of tokens, and which free ones to evict first.

A full block is named by sha256(parent block's hash || its token ids). Chaining makes the name stand for the
whole prefix up to and including the block, so one dict lookup per block finds the longest cached prefix, and
two requests share a page only if every earlier token matched too (attention at those positions saw the same
context). sha256 rather than Python's hash(): it is the same in every process and on every machine (a
prefill worker and a decode worker must agree on names when pages move between them), and a collision, which
would silently hand one request another's KV, is out of reach (2**-128 by the birthday bound) even for
adversarial prompts, where a 64-bit hash can be attacked.

Each layer group keeps its own page of a block (model/kv_groups.py), so a page's name is (group index, block
hash): the same tokens cached for one group say nothing about whether another group still has them.
"""

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence

ROOT_HASH = b""  # the parent of a sequence's first block

PageName = tuple[int, bytes]  # (layer group index, block hash)


def hash_block_tokens(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
    # Fixed-width little-endian ids: the bytes do not depend on the machine, and no two id lists share a byte string.
    return hashlib.sha256(parent_hash + struct.pack(f"<{len(token_ids)}q", *token_ids)).digest()


class PrefixCache:
    """Maps page names to page ids, keeps unreferenced named pages in LRU order, and counts hits.

    A named page is either in use (referenced by some block table; the block manager counts references) or
    evictable (reference count 0: kept for future hits, but reclaimed, least recently used first, as soon as a
    fresh page is needed).
    """

    def __init__(self) -> None:
        self._page_by_name: dict[PageName, int] = {}
        self._name_by_page: dict[int, PageName] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.num_query_tokens = 0
        self.num_hit_tokens = 0
        # Names gained and lost, for a router matching prompts against what each worker holds (cluster/affinity.py);
        # None (the default) records nothing. Entries: ("stored", name), ("removed", name).
        self.events: list[tuple[str, PageName]] | None = None

    def lookup(self, name: PageName) -> int | None:
        return self._page_by_name.get(name)

    def name_of(self, page: int) -> PageName | None:
        return self._name_by_page.get(page)

    def insert(self, name: PageName, page: int) -> None:
        """Name an in-use page by its contents; a name already cached keeps its first page (the newer copy stays
        unnamed and goes back to the free list when released)."""
        if name not in self._page_by_name and page not in self._name_by_page:
            self._page_by_name[name] = page
            self._name_by_page[page] = name
            if self.events is not None:
                self.events.append(("stored", name))

    def park(self, page: int) -> None:
        """A named page's last reference is gone: keep it for hits, most recently used."""
        self._evictable[page] = None

    def unpark(self, page: int) -> None:
        """A hit took an evictable page back into use."""
        del self._evictable[page]

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def evict_lru(self) -> int:
        """Forget the least recently used evictable page's contents and hand the page back for reuse."""
        page, _ = self._evictable.popitem(last=False)
        name = self._name_by_page.pop(page)
        del self._page_by_name[name]
        if self.events is not None:
            self.events.append(("removed", name))
        return page

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.num_query_tokens += num_query_tokens
        self.num_hit_tokens += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        """Token-level: the fraction of admitted tokens whose prefill the cache skipped."""
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0
