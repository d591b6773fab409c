"""The paged allocator for layer groups with prefix caching, driven by random interleavings of everything a
scheduler does, for one full-attention group, for full and sliding-window groups together, and for sliding
groups alone.

A shadow model records which group's tokens have been written into which page. Whatever the interleaving:
- every page is in exactly one state (held, free, or evictable-cached) and held pages' reference counts equal
  the number of block-table entries that hold them, so nothing leaks and nothing in use is handed out again;
- every token a later query can read (all of them for a full-attention group, those inside the window for a
  sliding one) reads back intact through the group's block table, and nobody ever writes into a page that is
  shared or named in the prefix cache;
- a sliding-window group never holds a page wholly below its window: it holds exactly the pages its window and
  the tokens in flight need;
- a prefix-cache hit is never stale: the hit page really holds those tokens, of that group;
- at the end, with every sequence freed, the whole pool can be allocated again.
"""

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ridgeline.engine.block_manager import RELEASED, BlockManager, first_readable_block, pages_held, peak_pages
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.sequence import Sequence

BLOCK_SIZE = 4
# Prompts are strung together from a few pieces, so they often share prefixes (and often end on a block
# boundary): hits, shared pages and evictions of pages that are still named are all common.
PIECES = [[1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], [9], [9, 9, 9]]
prompts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=5).map(lambda pieces: sum(pieces, []))
tails = st.lists(st.integers(0, 3), max_size=6)
chunk_sizes = st.integers(1, 20)


class BlockPoolMachine(RuleBasedStateMachine):
    WINDOWS: tuple[int | None, ...] = (None,)
    NUM_PAGES = 10  # small, so allocations fail and named pages are evicted mid-run

    def __init__(self) -> None:
        super().__init__()
        self.blocks = BlockManager(self.NUM_PAGES, BLOCK_SIZE, self.WINDOWS, enable_prefix_caching=True)
        self.live: list[Sequence] = []  # hold pages
        self.parked: list[Sequence] = []  # preempted or never admitted: hold none, may be admitted later
        self.pending: dict[Sequence, int] = {}  # tokens allocated for but not computed yet (a forward pass in flight)
        # shadow KV: (group, token id) written at each slot of each page
        self.written: list[list[tuple[int, int] | None]] = [[None] * BLOCK_SIZE for _ in range(self.NUM_PAGES)]
        self.num_requests = 0
        self.released_token_ids: list[list[int]] = []  # for later requests that repeat them: hits or evicted

    def _new_sequence(self, token_ids: list[int]) -> Sequence:
        self.num_requests += 1
        return Sequence(f"r{self.num_requests}", token_ids, SamplingParams(), arrival_time=0.0)

    def _state(self) -> tuple:
        return (list(self.blocks.ref_counts), self.blocks.num_free_pages, [[list(t) for t in s.block_tables] for s in self.live])

    def _readable(self, group: int, num_computed: int) -> range:
        """The computed positions a query at num_computed or later can still read in this group."""
        window = self.WINDOWS[group]
        return range(0 if window is None else max(0, num_computed - window + 1), num_computed)

    def _assert_holds_what_a_resume_at_needs(self, tables: list[list[int]], num_tokens: int) -> None:
        first = [first_readable_block(num_tokens, window, BLOCK_SIZE) for window in self.WINDOWS]
        for group, table in enumerate(tables):
            assert all((page == RELEASED) == (block < first[group]) for block, page in enumerate(table))

    def _admit(self, seq: Sequence, chunk: int, write_now: bool) -> None:
        hits = self.blocks.find_cached_prefix(seq)
        assert len({len(table) for table in hits}) == 1, "every group resumes from the same block"
        num_cached = len(hits[0]) * BLOCK_SIZE
        assert num_cached <= seq.num_tokens - 1, "the last token must always be computed"
        self._assert_holds_what_a_resume_at_needs(hits, num_cached)
        for group, table in enumerate(hits):
            for block, page in enumerate(table):
                if page != RELEASED:
                    expected = [(group, t) for t in seq.token_ids[block * BLOCK_SIZE : (block + 1) * BLOCK_SIZE]]
                    assert self.written[page] == expected, "stale hit"
        num_new = min(chunk, seq.num_tokens - num_cached)
        before = self._state()
        if self.blocks.allocate(seq, num_new, hits):
            seq.num_computed_tokens = num_cached
            self.live.append(seq)
            self.pending[seq] = num_new
            if write_now:
                self._write(seq)
        else:
            assert self._state() == before, "a failed allocation must change nothing"
            self.parked.append(seq)

    def _release(self, seq: Sequence) -> None:
        self.released_token_ids.append(list(seq.token_ids))
        self.blocks.free(seq)
        assert seq.block_tables == []
        self.live.remove(seq)
        self.pending.pop(seq, None)

    def _write(self, seq: Sequence) -> None:
        """The forward pass writes the allocated tokens' KV, then the pages it filled are named and the ones
        below the window released."""
        start, num_new = seq.num_computed_tokens, self.pending.pop(seq)
        for group, table in enumerate(seq.block_tables):
            for pos in range(start, start + num_new):
                page = table[pos // BLOCK_SIZE]
                assert page != RELEASED, "writing a token whose page was released"
                assert self.blocks.ref_counts[page] == 1, "writing into a shared page"
                assert self.blocks.prefix_cache.name_of(page) is None, "writing into a cached page"
                self.written[page][pos % BLOCK_SIZE] = (group, seq.token_ids[pos])
        self.blocks.mark_computed(seq, start + num_new)
        assert seq.num_computed_tokens == start + num_new

    # write_now=False leaves the forward pass in flight, so other rules (abort, eviction...) can cut in first.
    @rule(prompt=prompts, chunk=chunk_sizes, write_now=st.booleans())
    def admit_new(self, prompt: list[int], chunk: int, write_now: bool) -> None:
        self._admit(self._new_sequence(prompt), chunk, write_now)

    @precondition(lambda self: self.released_token_ids)
    @rule(data=st.data(), chunk=chunk_sizes, write_now=st.booleans())
    def repeat_a_released_request(self, data: st.DataObject, chunk: int, write_now: bool) -> None:
        self._admit(self._new_sequence(data.draw(st.sampled_from(self.released_token_ids))), chunk, write_now)

    @precondition(lambda self: self.parked)
    @rule(data=st.data(), chunk=chunk_sizes, write_now=st.booleans())
    def readmit(self, data: st.DataObject, chunk: int, write_now: bool) -> None:
        seq = data.draw(st.sampled_from(self.parked))
        self.parked.remove(seq)
        self._admit(seq, chunk, write_now)

    @precondition(lambda self: any(self.pending.get(s) for s in self.live))
    @rule(data=st.data())
    def finish_forward_pass(self, data: st.DataObject) -> None:
        self._write(data.draw(st.sampled_from([s for s in self.live if self.pending.get(s)])))

    @precondition(lambda self: any(not self.pending.get(s) for s in self.live))
    @rule(data=st.data(), chunk=chunk_sizes, token=st.integers(0, 3), write_now=st.booleans())
    def grow(self, data: st.DataObject, chunk: int, token: int, write_now: bool) -> None:
        """Next prefill chunk, or a decode step (sample a token, then make room for it); preempt when full."""
        seq = data.draw(st.sampled_from([s for s in self.live if not self.pending.get(s)]))
        if seq.num_uncomputed_tokens == 0:
            seq.append_token(token, now=0.0)
        num_new = min(chunk, seq.num_uncomputed_tokens)
        if self.blocks.allocate(seq, num_new):
            self.pending[seq] = num_new
            if write_now:
                self._write(seq)
        else:
            self._release(seq)
            seq.num_computed_tokens = 0
            self.parked.append(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=tails)
    def fork(self, data: st.DataObject, extra: list[int]) -> None:
        parent = data.draw(st.sampled_from(self.live))
        keep = data.draw(st.integers(1, parent.num_tokens))
        child = self._new_sequence(parent.token_ids[:keep] + extra)
        shared = self.blocks.fork(parent, child)
        assert shared % BLOCK_SIZE == 0 and shared <= min(child.num_tokens - 1, parent.num_computed_tokens)
        assert child.token_ids[:shared] == parent.token_ids[:shared]
        self._assert_holds_what_a_resume_at_needs(child.block_tables, shared)
        for child_table, parent_table in zip(child.block_tables, parent.block_tables):
            assert all(page in (RELEASED, parent_table[block]) for block, page in enumerate(child_table))
        child.num_computed_tokens = shared
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self._release(data.draw(st.sampled_from(self.live)))

    @precondition(lambda self: self.live or self.parked)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        """At any time, also mid-step with allocated but unwritten pages, or while holding nothing."""
        seq = data.draw(st.sampled_from(self.live + self.parked))
        if seq in self.live:
            self._release(seq)
        else:
            self.blocks.free(seq)
            self.parked.remove(seq)

    @invariant()
    def every_page_in_exactly_one_state(self) -> None:
        held = [(group, page) for seq in self.live for group, table in enumerate(seq.block_tables)
                for page in table if page != RELEASED]
        holders = Counter(page for _, page in held)
        assert len({page: group for group, page in held}) == len(set(held)), "a page held for two groups at once"
        free = list(self.blocks.free_pages)
        assert len(free) == len(set(free))
        for page in range(self.NUM_PAGES):
            assert self.blocks.ref_counts[page] == holders[page]
            assert not (holders[page] and page in free), f"page {page} is held and free at once"
        # Every page neither held nor free is evictable (cached, unreferenced), and no other page is.
        assert len(holders) + len(free) + self.blocks.prefix_cache.num_evictable == self.NUM_PAGES
        assert self.blocks.num_free_pages == self.NUM_PAGES - len(holders)
        assert math.isclose(self.blocks.usage, len(holders) / self.NUM_PAGES)

    @invariant()
    def tables_hold_exactly_the_window_and_read_back_intact(self) -> None:
        for seq in self.live:
            computed, covered = seq.num_computed_tokens, seq.num_computed_tokens + self.pending.get(seq, 0)
            assert len(seq.block_tables) == len(self.WINDOWS)
            for group, (table, window) in enumerate(zip(seq.block_tables, self.WINDOWS)):
                pages = [page for page in table if page != RELEASED]
                assert len(set(pages)) == len(pages)
                assert len(table) == math.ceil(covered / BLOCK_SIZE)
                # Nothing wholly below the window, nothing missing above it.
                first = first_readable_block(computed, window, BLOCK_SIZE)
                assert all((page == RELEASED) == (block < first) for block, page in enumerate(table))
                assert len(pages) == pages_held(computed, covered - computed, window, BLOCK_SIZE)
                for pos in self._readable(group, computed):
                    assert self.written[table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE] == (group, seq.token_ids[pos])
        for seq in self.parked:
            assert seq.block_tables == []

    def teardown(self) -> None:
        for seq in list(self.live):
            self._release(seq)
        assert self.blocks.num_free_pages == self.NUM_PAGES
        everything = self._new_sequence([0] * (self.NUM_PAGES // len(self.WINDOWS) * BLOCK_SIZE))
        assert self.blocks.allocate(everything, everything.num_tokens), "cached pages must all be reclaimable"
        assert self.blocks.num_free_pages == 0


class FullAndSlidingGroupsMachine(BlockPoolMachine):
    WINDOWS = (None, 6, 6)  # like Gemma 3: full-attention groups first, then sliding ones
    NUM_PAGES = 24


class SlidingGroupsOnlyMachine(BlockPoolMachine):
    WINDOWS = (5, 9)  # windows that are not multiples of the block size
    NUM_PAGES = 12


STATE_MACHINE_SETTINGS = settings(max_examples=200, stateful_step_count=50, deadline=None)
BlockPoolMachine.TestCase.settings = STATE_MACHINE_SETTINGS
FullAndSlidingGroupsMachine.TestCase.settings = STATE_MACHINE_SETTINGS
SlidingGroupsOnlyMachine.TestCase.settings = STATE_MACHINE_SETTINGS
TestOneFullGroup = BlockPoolMachine.TestCase
TestFullAndSlidingGroups = FullAndSlidingGroupsMachine.TestCase
TestSlidingGroupsOnly = SlidingGroupsOnlyMachine.TestCase


@settings(max_examples=300, deadline=None)
@given(num_tokens=st.integers(0, 300), max_chunk=st.integers(1, 80), window=st.integers(1, 70),
       block_size=st.sampled_from([1, 2, 4, 16]))
def test_peak_pages_is_the_most_any_chunk_of_the_sequence_holds(num_tokens, max_chunk, window, block_size) -> None:
    # Every chunk start a prefix hit, fork, preemption or budget split can produce, and the longest chunk from it.
    most = max((pages_held(c, min(max_chunk, num_tokens - c), window, block_size) for c in range(num_tokens)), default=0)
    assert peak_pages(num_tokens, max_chunk, [window], block_size) == most
    assert peak_pages(num_tokens, max_chunk, [None, window], block_size) == most + math.ceil(num_tokens / block_size)


def test_past_the_window_a_sliding_group_holds_a_bounded_number_of_pages() -> None:
    blocks = BlockManager(num_pages=64, block_size=4, windows=(None, 8))
    seq = Sequence("long", list(range(100)), SamplingParams(), arrival_time=0.0)
    for end in range(1, 101):  # prefill token by token, as decodes would
        assert blocks.allocate(seq, 1)
        blocks.mark_computed(seq, end)
        full, sliding = ([page for page in table if page != RELEASED] for table in seq.block_tables)
        assert len(full) == math.ceil(end / 4)
        assert len(sliding) <= math.ceil((8 - 1) / 4) + 1  # the window's 7 earlier keys span at most 3 blocks
    # The next query (position 100) reads keys 93..100: the sliding group keeps blocks 23 and 24 only.
    assert blocks.num_free_pages == 64 - 25 - 2
    blocks.free(seq)
    assert blocks.num_free_pages == 64
