"""The paged block allocator with prefix caching, driven by random interleavings of everything a scheduler does.

A shadow model records which tokens have been written into which block. Whatever the interleaving:
- every block is in exactly one state (held, free, or evictable-cached) and held blocks' reference counts equal
  the number of block tables that hold them, so nothing leaks and nothing in use is handed out again;
- a sequence's computed tokens read back intact through its block table, and nobody ever writes into a block
  that is shared or named in the prefix cache;
- a prefix-cache hit is never stale: the hit block really holds those tokens;
- at the end, with every sequence freed, the whole pool can be allocated again.
"""

import math
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ridgeline.engine.block_manager import BlockManager
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.sequence import Sequence

BLOCK_SIZE = 4
NUM_BLOCKS = 10  # small, so allocations fail and named blocks are evicted mid-run
# Prompts are strung together from a few pieces, so they often share prefixes (and often end on a block
# boundary): hits, shared blocks and evictions of blocks that are still named are all common.
PIECES = [[1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], [9], [9, 9, 9]]
prompts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map(lambda pieces: sum(pieces, []))
tails = st.lists(st.integers(0, 3), max_size=6)
chunk_sizes = st.integers(1, 20)


class BlockPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        self.live: list[Sequence] = []  # hold blocks
        self.parked: list[Sequence] = []  # preempted or never admitted: hold none, may be admitted later
        self.pending: dict[Sequence, int] = {}  # tokens allocated for but not computed yet (a forward pass in flight)
        self.written: list[list[int | None]] = [[None] * BLOCK_SIZE for _ in range(NUM_BLOCKS)]  # shadow KV
        self.num_requests = 0
        self.released_token_ids: list[list[int]] = []  # for later requests that repeat them: hits or evicted

    def _new_sequence(self, token_ids: list[int]) -> Sequence:
        self.num_requests += 1
        return Sequence(f"r{self.num_requests}", token_ids, SamplingParams(), arrival_time=0.0)

    def _state(self) -> tuple:
        return (list(self.blocks.ref_counts), self.blocks.num_free_blocks, [list(s.block_table) for s in self.live])

    def _admit(self, seq: Sequence, chunk: int, write_now: bool) -> None:
        hits = self.blocks.find_cached_prefix(seq)
        num_cached = len(hits) * BLOCK_SIZE
        assert num_cached <= seq.num_tokens - 1, "the last token must always be computed"
        for i, block_id in enumerate(hits):
            assert self.written[block_id] == seq.token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE], "stale hit"
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
        assert seq.block_table == []
        self.live.remove(seq)
        self.pending.pop(seq, None)

    def _write(self, seq: Sequence) -> None:
        """The forward pass writes the allocated tokens' KV, then the blocks it filled are named."""
        start, num_new = seq.num_computed_tokens, self.pending.pop(seq)
        for pos in range(start, start + num_new):
            block_id = seq.block_table[pos // BLOCK_SIZE]
            assert self.blocks.ref_counts[block_id] == 1, "writing into a shared block"
            assert self.blocks.prefix_cache.hash_of(block_id) is None, "writing into a cached block"
            self.written[block_id][pos % BLOCK_SIZE] = seq.token_ids[pos]
        self.blocks.cache_blocks(seq, start, start + num_new)
        seq.num_computed_tokens = start + num_new

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
        assert shared % BLOCK_SIZE == 0 and shared <= child.num_tokens - 1
        assert child.block_table == parent.block_table[: shared // BLOCK_SIZE]
        child.num_computed_tokens = shared
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self._release(data.draw(st.sampled_from(self.live)))

    @precondition(lambda self: self.live or self.parked)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        """At any time, also mid-step with allocated but unwritten blocks, or while holding nothing."""
        seq = data.draw(st.sampled_from(self.live + self.parked))
        if seq in self.live:
            self._release(seq)
        else:
            self.blocks.free(seq)
            self.parked.remove(seq)

    @rule()
    def evict_all_cached(self) -> None:
        self.blocks.reset_prefix_cache()

    @invariant()
    def every_block_in_exactly_one_state(self) -> None:
        holders = Counter(block_id for seq in self.live for block_id in seq.block_table)
        free = list(self.blocks.free_block_ids)
        assert len(free) == len(set(free))
        for block_id in range(NUM_BLOCKS):
            assert self.blocks.ref_counts[block_id] == holders[block_id]
            states = (holders[block_id] > 0, block_id in free, self.blocks.prefix_cache.is_evictable(block_id))
            assert sum(states) == 1, f"block {block_id}: held/free/evictable = {states}"
        assert self.blocks.num_free_blocks == NUM_BLOCKS - len(holders)
        assert math.isclose(self.blocks.usage, len(holders) / NUM_BLOCKS)

    @invariant()
    def tables_cover_exactly_what_was_asked_and_read_back_intact(self) -> None:
        for seq in self.live:
            assert len(set(seq.block_table)) == len(seq.block_table)
            covered = seq.num_computed_tokens + self.pending.get(seq, 0)
            assert len(seq.block_table) == math.ceil(covered / BLOCK_SIZE)
            for pos in range(seq.num_computed_tokens):
                assert self.written[seq.block_table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE] == seq.token_ids[pos]
        for seq in self.parked:
            assert seq.block_table == []

    def teardown(self) -> None:
        for seq in list(self.live):
            self._release(seq)
        assert self.blocks.num_free_blocks == NUM_BLOCKS
        everything = self._new_sequence([0] * (NUM_BLOCKS * BLOCK_SIZE))
        assert self.blocks.allocate(everything, everything.num_tokens), "cached blocks must all be reclaimable"
        assert self.blocks.num_free_blocks == 0


BlockPoolMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestBlockPool = BlockPoolMachine.TestCase
