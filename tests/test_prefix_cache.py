"""Prefix caching in the block manager: naming full blocks by chained hash, hits, LRU eviction, statistics, and
hits for sliding-window groups, which need only the pages the resuming query can read."""

from ridgeline.engine.block_manager import RELEASED, BlockManager
from ridgeline.engine.prefix_cache import ROOT_HASH, PrefixCache, hash_block_tokens
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.sequence import Sequence

BS = 4


def make_seq(request_id: str, token_ids: list[int]) -> Sequence:
    return Sequence(request_id, token_ids, SamplingParams(), arrival_time=0.0)


def prefill(blocks: BlockManager, seq: Sequence) -> None:
    """Admit seq with whatever prefix is cached and compute the rest of it in one pass."""
    hits = blocks.find_cached_prefix(seq)
    assert blocks.allocate(seq, seq.num_tokens - len(hits[0]) * BS, hits)
    seq.num_computed_tokens = len(hits[0]) * BS
    blocks.mark_computed(seq, seq.num_tokens)


def num_hit_blocks(blocks: BlockManager, seq: Sequence) -> int:
    return len(blocks.find_cached_prefix(seq)[0])


def test_block_hash_names_the_whole_prefix_not_just_the_block() -> None:
    first = hash_block_tokens(ROOT_HASH, [1, 2, 3, 4])
    assert hash_block_tokens(ROOT_HASH, [1, 2, 3, 4]) == first  # stable
    assert hash_block_tokens(ROOT_HASH, [4, 3, 2, 1]) != first  # order matters
    # The same tokens after a different parent are a different block: attention saw a different context.
    assert hash_block_tokens(first, [5, 6, 7, 8]) != hash_block_tokens(hash_block_tokens(ROOT_HASH, [0, 2, 3, 4]), [5, 6, 7, 8])
    # Ids are packed at a fixed width, so different id lists never share a byte string.
    assert hash_block_tokens(ROOT_HASH, [1, 256]) != hash_block_tokens(ROOT_HASH, [256, 1])


def test_hit_covers_the_longest_cached_run_of_full_blocks() -> None:
    blocks = BlockManager(num_pages=16, block_size=BS)
    prefill(blocks, make_seq("a", list(range(10))))  # blocks [0..3], [4..7] are full and cached; [8, 9] is not
    same_start = make_seq("b", list(range(8)) + [99, 98, 97])
    assert num_hit_blocks(blocks, same_start) == 2
    differs_in_first_block = make_seq("c", [42] + list(range(1, 11)))
    assert num_hit_blocks(blocks, differs_in_first_block) == 0


def test_hit_never_covers_the_last_token() -> None:
    blocks = BlockManager(num_pages=16, block_size=BS)
    prefill(blocks, make_seq("a", list(range(12))))
    # Same 12 tokens, all three blocks cached: the last block is recomputed so there are logits to sample.
    again = make_seq("b", list(range(12)))
    assert num_hit_blocks(blocks, again) == 2
    assert num_hit_blocks(blocks, make_seq("c", list(range(13)))) == 3


def test_hits_share_blocks_by_reference_count() -> None:
    blocks = BlockManager(num_pages=16, block_size=BS)
    a = make_seq("a", list(range(9)))
    prefill(blocks, a)
    b = make_seq("b", list(range(9)))
    prefill(blocks, b)
    (a_table,), (b_table,) = a.block_tables, b.block_tables
    assert b_table[:2] == a_table[:2]
    assert b_table[2] != a_table[2]  # the partial last block is each one's own
    assert [blocks.ref_counts[i] for i in a_table] == [2, 2, 1]
    assert blocks.num_free_pages == 16 - 4


def test_blocks_are_cached_as_chunked_prefill_fills_them() -> None:
    blocks = BlockManager(num_pages=16, block_size=BS)
    seq = make_seq("a", list(range(11)))
    probe = make_seq("probe", list(range(11)))
    assert blocks.allocate(seq, 6)
    blocks.mark_computed(seq, 6)  # first chunk: tokens 0..5 written, one block full
    assert num_hit_blocks(blocks, probe) == 1
    assert blocks.allocate(seq, 5)
    blocks.mark_computed(seq, 11)  # second chunk finishes the second block
    assert num_hit_blocks(blocks, probe) == 2


def test_freed_cached_blocks_stay_hittable_until_a_fresh_block_is_needed() -> None:
    blocks = BlockManager(num_pages=4, block_size=BS)
    a = make_seq("a", list(range(8)))  # exactly two full blocks
    prefill(blocks, a)
    (a_pages,) = a.block_tables
    blocks.free(a)
    assert blocks.num_free_pages == 4  # evictable pages count as free
    assert blocks.prefix_cache.num_evictable == len(a_pages) == 2
    # Two fresh blocks come from the free list: the cached ones survive.
    filler = make_seq("filler", [50] * 8)
    assert blocks.allocate(filler, 8)
    filler.num_computed_tokens = 8
    assert num_hit_blocks(blocks, make_seq("probe", list(range(9)))) == 2
    # The next fresh page must evict one: least recently used first, and a's tail was released first.
    assert blocks.allocate(filler, 1)
    assert filler.block_tables[0][-1] == a_pages[1]
    assert num_hit_blocks(blocks, make_seq("probe2", list(range(9)))) == 1


def test_evicted_block_is_never_a_stale_hit() -> None:
    blocks = BlockManager(num_pages=2, block_size=BS)
    a = make_seq("a", [1, 1, 1, 1, 2])
    prefill(blocks, a)
    cached_page = a.block_tables[0][0]
    blocks.free(a)
    b = make_seq("b", [7, 7, 7, 7, 7, 7, 7])  # needs both pages: evicts a's cached page and overwrites it
    prefill(blocks, b)
    assert cached_page in b.block_tables[0]
    blocks.free(b)
    assert num_hit_blocks(blocks, make_seq("c", [1, 1, 1, 1, 2])) == 0


def test_allocation_counts_revived_evictable_hits_against_the_pool() -> None:
    blocks = BlockManager(num_pages=3, block_size=BS)
    a = make_seq("a", list(range(8)))
    prefill(blocks, a)
    blocks.free(a)  # two evictable pages, one free
    b = make_seq("b", list(range(8)) + [0] * 8)  # hits both, then needs 2 fresh pages but only 1 is left
    hits = blocks.find_cached_prefix(b)
    assert len(hits[0]) == 2
    assert not blocks.allocate(b, 8, hits)
    assert b.block_tables == [] and blocks.num_free_pages == 3
    assert blocks.allocate(b, 4, hits)
    assert blocks.num_free_pages == 0


def test_the_same_block_computed_twice_is_named_once() -> None:
    blocks = BlockManager(num_pages=8, block_size=BS)
    a, b = make_seq("a", list(range(5))), make_seq("b", list(range(5)))
    # Admitted together, before either has written anything: no hits, two copies of the first block.
    for seq in (a, b):
        assert blocks.allocate(seq, 5)
    for seq in (a, b):
        blocks.mark_computed(seq, 5)
    assert blocks.prefix_cache.name_of(a.block_tables[0][0]) is not None
    assert blocks.prefix_cache.name_of(b.block_tables[0][0]) is None
    blocks.free(a)
    blocks.free(b)
    assert blocks.prefix_cache.num_evictable == 1 and len(blocks.free_pages) == 7


def test_caching_disabled_never_hits() -> None:
    blocks = BlockManager(num_pages=8, block_size=BS, enable_prefix_caching=False)
    prefill(blocks, make_seq("a", list(range(9))))
    assert num_hit_blocks(blocks, make_seq("b", list(range(9)))) == 0


def test_hit_rate_is_token_level() -> None:
    cache = PrefixCache()
    assert cache.hit_rate == 0.0
    cache.record_lookup(num_query_tokens=100, num_hit_tokens=0)
    cache.record_lookup(num_query_tokens=100, num_hit_tokens=96)
    assert cache.hit_rate == 96 / 200


def test_a_sliding_group_hit_needs_only_the_pages_the_resuming_query_reads() -> None:
    blocks = BlockManager(num_pages=64, block_size=BS, windows=(None, 6))
    a = make_seq("a", list(range(41)))
    prefill(blocks, a)
    (full, sliding) = blocks.find_cached_prefix(make_seq("b", list(range(41))))
    # Resuming at position 40, the query reads keys 35..40: blocks 8 and 9 of the sliding group, all ten of the
    # full-attention group. The sliding pages for blocks 8 (released by `a` as it moved on) and 9 are still named.
    assert full == a.block_tables[0][:10]
    assert sliding[:8] == [RELEASED] * 8 and a.block_tables[1][8] == RELEASED
    assert [blocks.prefix_cache.name_of(page) for page in sliding[8:]] == [(1, h) for h in a.block_hashes[8:10]]


def test_pages_released_below_the_window_are_evicted_first_and_a_hit_needs_the_window_cached() -> None:
    blocks = BlockManager(num_pages=20, block_size=BS, windows=(None, 6))
    a = make_seq("a", list(range(21)))
    prefill(blocks, a)  # 6 + 6 pages; the sliding group released blocks 0..3 as soon as they were computed
    blocks.free(a)
    assert blocks.prefix_cache.num_evictable == 5 + 5
    probe = make_seq("probe", list(range(21)))
    fillers = [make_seq(f"filler{i}", [90 + i] * n) for i, n in enumerate((20, 1, 1))]
    assert blocks.allocate(fillers[0], 20)  # 10 pages: the free ones
    assert blocks.allocate(fillers[1], 1)  # 2 pages, evicted: the sliding group's blocks 0 and 1 go first
    # Resuming at 20 reads keys 15..20, sliding blocks 3 and 4: still a hit.
    assert num_hit_blocks(blocks, probe) == 5
    assert blocks.allocate(fillers[2], 1)  # evicts sliding blocks 2 and 3
    # The full-attention group still has every block, but no resume point has its sliding window cached.
    assert all(blocks.prefix_cache.lookup((0, h)) is not None for h in probe.block_hashes)
    assert num_hit_blocks(blocks, probe) == 0
    for filler in fillers:
        blocks.free(filler)
    assert blocks.num_free_pages == 20
