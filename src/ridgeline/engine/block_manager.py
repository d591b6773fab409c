"""Paged KV allocation for layer groups: one pool of pages, one block table per group per sequence, reference counts.

Block i of a sequence is its token positions [i*bs, (i+1)*bs); a page is the KV memory of one block for the layers
of one layer group (model/kv_groups.py), and all groups draw their pages from the one pool. Every page is in
exactly one state: free (no reference, no cached contents), in use (referenced by one or more block tables;
shared pages hold a prefix common to all their holders), or evictable (no reference, but its contents are named
in the prefix cache so a later request can reuse them). Fresh pages come from the free list first and from
evicting the least recently used evictable page only when the free list is empty.

A sliding-window group (window w) gives a page up as soon as no later query can read it: the query at position
p reads keys >= p - w + 1, so once c tokens are computed the blocks wholly below c - w + 1 are released and their
entries become RELEASED, which the model never reads or writes. A full-attention group keeps every page until
the sequence ends. So past the window a token costs only the full-attention groups' pages.

Pure bookkeeping: the model runner owns the KV tensors and writes group g's block i at slots
`page * block_size .. page * block_size + block_size - 1` of group g's layers, page = block_tables[g][i].
"""

import math
from collections import deque
from collections.abc import Callable, Iterable

from ridgeline.engine.prefix_cache import ROOT_HASH, PrefixCache, hash_block_tokens
from ridgeline.engine.sequence import Sequence

RELEASED = -1  # a block-table entry whose page a sliding-window group gave up (or never needed)


def first_readable_block(num_computed: int, window: int | None, block_size: int) -> int:
    """The first block that a query at position num_computed or later can read."""
    return 0 if window is None else max(0, num_computed - window + 1) // block_size


def resume_position(num_tokens: int, block_size: int) -> int:
    """Where a later request for these same num_tokens tokens starts computing: a prefix hit is whole blocks and
    leaves at least the last token to compute (for its logits)."""
    return max(0, num_tokens - 1) // block_size * block_size


def first_kept_block(num_tokens: int, window: int | None, block_size: int) -> int:
    """The first block worth keeping of a sequence of num_tokens computed tokens whose pages move to another engine:
    not the first block its own next query reads, but the first one a repeat of the same tokens reads. That repeat
    is a hit of at most num_tokens - 1 tokens in whole blocks, so its first computed query can sit up to a block
    lower and reach one block further back. Without that block a sliding group never matches the repeat."""
    return first_readable_block(resume_position(num_tokens, block_size), window, block_size)


def pages_held(num_computed: int, num_new: int, window: int | None, block_size: int) -> int:
    """Pages one group's table holds while tokens [num_computed, num_computed + num_new) are computed."""
    return math.ceil((num_computed + num_new) / block_size) - first_readable_block(num_computed, window, block_size)


def peak_pages(num_tokens: int, max_chunk: int, windows: Iterable[int | None], block_size: int) -> int:
    """The most pages one sequence ever holds on its way to num_tokens tokens, computed in chunks of at most
    max_chunk tokens starting anywhere (after a prefix hit, a fork or a preemption): a chunk's pages for all its
    tokens are held while it runs, and only then are the ones below the window released."""
    if num_tokens == 0:
        return 0
    total = 0
    for window in windows:
        if window is None:
            total += math.ceil(num_tokens / block_size)
            continue
        # Between two changes of first_readable_block, the pages held grow with the chunk's start, so the most
        # is at the last start c_k = window + bs - 2 + k*bs before a change. Chunks of a full max_chunk tokens all
        # hold equally many; chunks cut short by the end of the sequence hold fewer the later they start. So the
        # first start (k=0) and the first start whose chunk is cut short (k_cut) cover every case.
        last_start_0 = window + block_size - 2
        k_cut = max(0, (num_tokens - max_chunk - last_start_0) // block_size + 1)
        total += max(pages_held(c, min(max_chunk, num_tokens - c), window, block_size)
                     for c in (min(num_tokens - 1, last_start_0), min(num_tokens - 1, last_start_0 + k_cut * block_size)))
    return total


def longest_fitting_sequence(num_pages: int, max_chunk: int, windows: Iterable[int | None], block_size: int,
                             max_len: int) -> int:
    """The most tokens (up to max_len) one sequence can reach with num_pages pages, computed in chunks of at most
    max_chunk tokens: any longer and, even alone, it would run out of pages on the way."""
    windows = tuple(windows)
    low, high = 0, max_len  # peak_pages grows with the length; the answer is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if peak_pages(middle, max_chunk, windows, block_size) <= num_pages else (low, middle - 1)
    return low


class BlockManager:
    def __init__(self, num_pages: int, block_size: int = 16, windows: Iterable[int | None] = (None,),
                 enable_prefix_caching: bool = True) -> None:
        if num_pages < 1 or block_size < 1 or not windows:
            raise ValueError(f"need num_pages >= 1, block_size >= 1 and a layer group, got {num_pages}, {block_size}, {windows}")
        self.num_pages = num_pages
        self.block_size = block_size
        self.windows = tuple(windows)  # attention window of each layer group (None = full attention)
        self.ref_counts = [0] * num_pages
        self.free_pages = deque(range(num_pages))
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None

    @property
    def num_free_pages(self) -> int:
        """Pages a fresh allocation can take: free ones plus evictable cached ones."""
        evictable = self.prefix_cache.num_evictable if self.prefix_cache else 0
        return len(self.free_pages) + evictable

    @property
    def usage(self) -> float:
        """Fraction of the pool held by sequences (evictable cached pages count as free)."""
        return 1.0 - self.num_free_pages / self.num_pages

    def num_blocks_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def find_cached_prefix(self, seq: Sequence, computed_elsewhere: bool = False) -> list[list[int]]:
        """Per group, the cached pages seq can resume from (see _longest_prefix); nothing is taken yet.

        Never the whole sequence: its last token must be computed so there are logits to sample from.
        `computed_elsewhere`: the prompt's tokens past the hit are not computed here; their KV arrives from another
        engine (a KV transfer). A sliding-window group then needs no block below those the prompt keeps
        (first_kept_block), where computing the rest here would read the window below the hit's end.
        """
        if self.prefix_cache is None:
            return [[] for _ in self.windows]
        hashes = self._block_hashes(seq, (seq.num_tokens - 1) // self.block_size)
        bs, kept = self.block_size, seq.num_prompt_tokens
        first_needed = ((lambda length, window: first_kept_block(kept, window, bs)) if computed_elsewhere
                        else (lambda length, window: first_readable_block(length * bs, window, bs)))
        return self._longest_prefix(len(hashes), lambda group, block: self.prefix_cache.lookup((group, hashes[block])),
                                    first_needed)

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: list[list[int]] | None = None) -> bool:
        """Grow seq's block tables to cover its computed tokens, then the `cached` prefix (from
        find_cached_prefix, only for a sequence that holds no pages yet), then num_new_tokens more.

        All or nothing: returns False, changing nothing, when the pool cannot supply the fresh pages.
        """
        num_cached_blocks = len(cached[0]) if cached else 0
        if not num_cached_blocks and seq.block_tables:  # the common decode step: pages already cover the token
            num_blocks = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
            if all(len(table) >= num_blocks for table in seq.block_tables):
                return True
        if num_cached_blocks and (any(seq.block_tables) or seq.num_computed_tokens):
            raise ValueError(f"{seq.request_id}: a cached prefix can only start empty block tables")
        tables = cached if num_cached_blocks else seq.block_tables or [[] for _ in self.windows]
        num_covered = seq.num_computed_tokens + num_cached_blocks * self.block_size + num_new_tokens
        num_blocks = self.num_blocks_for(num_covered)
        num_fresh = sum(max(0, num_blocks - len(table)) for table in tables)
        # A hit on an evictable page takes it out of the pool the fresh pages are drawn from.
        hits = [page for table in (cached or []) for page in table if page != RELEASED]
        num_revived = sum(1 for page in hits if self.ref_counts[page] == 0)
        if num_fresh > self.num_free_pages - num_revived:
            return False
        for page in hits:
            self._add_reference(page)
        seq.block_tables = [list(table) + [self._take_fresh_page() for _ in range(num_blocks - len(table))]
                            for table in tables]
        return True

    def mark_computed(self, seq: Sequence, num_computed_tokens: int, keep_for_transfer: bool = False) -> None:
        """Tokens [seq.num_computed_tokens, num_computed_tokens) now have their KV written: name every page this
        filled (so later requests can hit it), advance seq, and release the pages no later query reads.
        `keep_for_transfer`: the prompt's pages will move to another engine, so keep them from first_kept_block
        (one sliding block more, which a repeat of this prompt on that engine reads; kept only once the prompt's
        last block is being computed, so never more than a chunk starting at resume_position holds)."""
        start, bs = seq.num_computed_tokens, self.block_size
        if self.prefix_cache is not None and num_computed_tokens // bs > start // bs:  # a block just filled up
            hashes = self._block_hashes(seq, num_computed_tokens // bs)
            for group, table in enumerate(seq.block_tables):
                for block in range(start // bs, len(hashes)):
                    if table[block] != RELEASED:  # (a page released unwritten, see release_below_window)
                        self.prefix_cache.insert((group, hashes[block]), table[block])
        seq.num_computed_tokens = num_computed_tokens
        release_to = num_computed_tokens
        if keep_for_transfer and num_computed_tokens <= seq.num_prompt_tokens:  # (only the prompt's KV moves)
            release_to = min(num_computed_tokens, resume_position(seq.num_prompt_tokens, bs))
        self.release_below_window(seq, release_to)

    def release_below_window(self, seq: Sequence, num_tokens: int) -> None:
        """Release the pages of sliding-window groups that no query at position num_tokens or later reads. Called
        by mark_computed, and on its own for pages reserved for KV arriving from another engine, whose blocks
        below the window never arrive: released here unwritten, they are never named for prefix hits."""
        bs = self.block_size
        for group, window in enumerate(self.windows):
            if window is None:  # full attention keeps every page
                continue
            table = seq.block_tables[group]
            # Released entries form a prefix of the table, so walk down from the window to the last one released.
            stop = first_readable_block(num_tokens, window, bs)
            start_block = stop
            while start_block > 0 and table[start_block - 1] != RELEASED:
                start_block -= 1
            for block in range(start_block, stop):  # oldest first, so it is evicted first
                self._drop_reference(table[block])
                table[block] = RELEASED

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the pages of blocks past the one holding token num_tokens - 1 (a decode's rejected guesses
        had KV written there; never named, so they go straight to the free list)."""
        keep = self.num_blocks_for(num_tokens)
        for table in seq.block_tables:
            while len(table) > keep:
                page = table.pop()
                if page != RELEASED:
                    self._drop_reference(page)

    def fork(self, parent: Sequence, child: Sequence) -> int:
        """Share with a child holding no pages the parent's computed full blocks whose tokens the child also starts
        with (e.g. the prompt, for the n samples of one request), group by group. Returns how many of the child's
        tokens are thereby computed. Only full blocks are shared, so neither side ever writes into a page the
        other reads."""
        if any(child.block_tables):
            raise ValueError(f"{child.request_id}: can only fork into a sequence that holds no pages")
        bs = self.block_size
        # Like a cache hit, leave the child's last token to compute.
        limit = min(parent.num_computed_tokens, child.num_tokens - 1) // bs
        same = 0
        while same < limit and parent.token_ids[same * bs : (same + 1) * bs] == child.token_ids[same * bs : (same + 1) * bs]:
            same += 1
        tables = self._longest_prefix(same, lambda group, block: None if (page := parent.block_tables[group][block]) == RELEASED else page,
                                      lambda length, window: first_readable_block(length * bs, window, bs))
        for table in tables:
            for page in table:
                if page != RELEASED:
                    self._add_reference(page)
        child.block_tables = tables
        return len(tables[0]) * bs

    def free(self, seq: Sequence) -> None:
        """Drop seq's references. A page nobody holds goes to the evictable LRU if its contents are cached, else
        to the free list. Tail blocks are released first so they are evicted before the shared prefix."""
        for block in reversed(range(len(seq.block_tables[0]) if seq.block_tables else 0)):
            for table in seq.block_tables:
                if table[block] != RELEASED:
                    self._drop_reference(table[block])
        seq.block_tables = []

    def _longest_prefix(self, max_blocks: int, page_of: Callable[[int, int], int | None],
                        first_needed: Callable[[int, int], int]) -> list[list[int]]:
        """Per group, the pages of the longest run of L <= max_blocks leading blocks a sequence can resume from
        (page_of(group, block) gives a page that holds that block's KV, or None): full-attention groups need every
        block below L, a sliding-window group only those from first_needed(L, window) on (RELEASED below): the
        blocks a query at position L*bs reads when the rest is computed here, fewer when it arrives computed."""
        length = max_blocks
        for group, window in enumerate(self.windows):
            if window is None:
                length = next((block for block in range(length) if page_of(group, block) is None), length)
        sliding = [group for group, window in enumerate(self.windows) if window is not None]
        # runs[group][b]: how many consecutive blocks ending at b (inclusive) the group has a page for.
        runs = {}
        for group in sliding:
            run, runs[group] = 0, []
            for block in range(length):
                run = run + 1 if page_of(group, block) is not None else 0
                runs[group].append(run)

        def start(group: int) -> int:
            window = self.windows[group]
            return 0 if window is None else min(length, first_needed(length, window))

        while length > 0 and any(runs[g][length - 1] < length - start(g) for g in sliding):
            length -= 1
        return [[page_of(group, block) if block >= start(group) else RELEASED for block in range(length)]
                for group in range(len(self.windows))]

    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """seq's chained hashes of its first num_blocks full blocks: what names their pages in any engine."""
        return list(self._block_hashes(seq, num_blocks))

    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """seq's chained block hashes for its first num_blocks full blocks (extending seq.block_hashes)."""
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash_block_tokens(hashes[-1] if hashes else ROOT_HASH, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes[:num_blocks]

    def _add_reference(self, page: int) -> None:
        if self.ref_counts[page] == 0:
            self.prefix_cache.unpark(page)  # only cached pages can be hit with no reference
        self.ref_counts[page] += 1

    def _drop_reference(self, page: int) -> None:
        self.ref_counts[page] -= 1
        if self.ref_counts[page] == 0:
            if self.prefix_cache is not None and self.prefix_cache.name_of(page) is not None:
                self.prefix_cache.park(page)
            else:
                self.free_pages.append(page)

    def _take_fresh_page(self) -> int:
        page = self.free_pages.popleft() if self.free_pages else self.prefix_cache.evict_lru()
        self.ref_counts[page] = 1
        return page
