"""Prefix caching in the block manager: naming full blocks by chained hash, hits, LRU eviction, statistics."""

from ridgeline.engine.block_manager import BlockManager
from ridgeline.engine.prefix_cache import ROOT_HASH, PrefixCache, hash_block_tokens
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.sequence import Sequence

BS = 4


def make_seq(request_id: str, token_ids: list[int]) -> Sequence:
    return Sequence(request_id, token_ids, SamplingParams(), arrival_time=0.0)


def prefill(blocks: BlockManager, seq: Sequence) -> None:
    """Admit seq with whatever prefix is cached and compute the rest of it in one pass."""
    hits = blocks.find_cached_prefix(seq)
    assert blocks.allocate(seq, seq.num_tokens - len(hits) * BS, hits)
    seq.num_computed_tokens = len(hits) * BS
    blocks.cache_blocks(seq, seq.num_computed_tokens, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens


def test_block_hash_names_the_whole_prefix_not_just_the_block() -> None:
    first = hash_block_tokens(ROOT_HASH, [1, 2, 3, 4])
    assert hash_block_tokens(ROOT_HASH, [1, 2, 3, 4]) == first  # stable
    assert hash_block_tokens(ROOT_HASH, [4, 3, 2, 1]) != first  # order matters
    # The same tokens after a different parent are a different block: attention saw a different context.
    assert hash_block_tokens(first, [5, 6, 7, 8]) != hash_block_tokens(hash_block_tokens(ROOT_HASH, [0, 2, 3, 4]), [5, 6, 7, 8])
    # Ids are packed at a fixed width, so different id lists never share a byte string.
    assert hash_block_tokens(ROOT_HASH, [1, 256]) != hash_block_tokens(ROOT_HASH, [256, 1])


def test_hit_covers_the_longest_cached_run_of_full_blocks() -> None:
    blocks = BlockManager(num_blocks=16, block_size=BS)
    prefill(blocks, make_seq("a", list(range(10))))  # blocks [0..3], [4..7] are full and cached; [8, 9] is not
    same_start = make_seq("b", list(range(8)) + [99, 98, 97])
    assert len(blocks.find_cached_prefix(same_start)) == 2
    differs_in_first_block = make_seq("c", [42] + list(range(1, 11)))
    assert blocks.find_cached_prefix(differs_in_first_block) == []


def test_hit_never_covers_the_last_token() -> None:
    blocks = BlockManager(num_blocks=16, block_size=BS)
    prefill(blocks, make_seq("a", list(range(12))))
    # Same 12 tokens, all three blocks cached: the last block is recomputed so there are logits to sample.
    again = make_seq("b", list(range(12)))
    assert len(blocks.find_cached_prefix(again)) == 2
    assert len(blocks.find_cached_prefix(make_seq("c", list(range(13))))) == 3


def test_hits_share_blocks_by_reference_count() -> None:
    blocks = BlockManager(num_blocks=16, block_size=BS)
    a = make_seq("a", list(range(9)))
    prefill(blocks, a)
    b = make_seq("b", list(range(9)))
    prefill(blocks, b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]  # the partial last block is each one's own
    assert [blocks.ref_counts[i] for i in a.block_table] == [2, 2, 1]
    assert blocks.num_free_blocks == 16 - 4


def test_blocks_are_cached_as_chunked_prefill_fills_them() -> None:
    blocks = BlockManager(num_blocks=16, block_size=BS)
    seq = make_seq("a", list(range(11)))
    probe = make_seq("probe", list(range(11)))
    assert blocks.allocate(seq, 6)
    blocks.cache_blocks(seq, 0, 6)  # first chunk: tokens 0..5 written, one block full
    seq.num_computed_tokens = 6
    assert len(blocks.find_cached_prefix(probe)) == 1
    assert blocks.allocate(seq, 5)
    blocks.cache_blocks(seq, 6, 11)  # second chunk finishes the second block
    assert len(blocks.find_cached_prefix(probe)) == 2


def test_freed_cached_blocks_stay_hittable_until_a_fresh_block_is_needed() -> None:
    blocks = BlockManager(num_blocks=4, block_size=BS)
    a = make_seq("a", list(range(8)))  # exactly two full blocks
    prefill(blocks, a)
    a_blocks = list(a.block_table)
    blocks.free(a)
    assert blocks.num_free_blocks == 4  # evictable blocks count as free
    assert all(blocks.prefix_cache.is_evictable(i) for i in a_blocks)
    # Two fresh blocks come from the free list: the cached ones survive.
    filler = make_seq("filler", [50] * 8)
    assert blocks.allocate(filler, 8)
    filler.num_computed_tokens = 8
    assert len(blocks.find_cached_prefix(make_seq("probe", list(range(9))))) == 2
    # The next fresh block must evict one: least recently used first, and a's tail was released first.
    assert blocks.allocate(filler, 1)
    assert filler.block_table[-1] == a_blocks[1]
    assert len(blocks.find_cached_prefix(make_seq("probe2", list(range(9))))) == 1


def test_evicted_block_is_never_a_stale_hit() -> None:
    blocks = BlockManager(num_blocks=2, block_size=BS)
    a = make_seq("a", [1, 1, 1, 1, 2])
    prefill(blocks, a)
    cached_block = a.block_table[0]
    blocks.free(a)
    b = make_seq("b", [7, 7, 7, 7, 7, 7, 7])  # needs both blocks: evicts a's cached block and overwrites it
    prefill(blocks, b)
    assert cached_block in b.block_table
    blocks.free(b)
    assert blocks.find_cached_prefix(make_seq("c", [1, 1, 1, 1, 2])) == []


def test_allocation_counts_revived_evictable_hits_against_the_pool() -> None:
    blocks = BlockManager(num_blocks=3, block_size=BS)
    a = make_seq("a", list(range(8)))
    prefill(blocks, a)
    blocks.free(a)  # two evictable blocks, one free
    b = make_seq("b", list(range(8)) + [0] * 8)  # hits both, then needs 2 fresh blocks but only 1 is left
    hits = blocks.find_cached_prefix(b)
    assert len(hits) == 2
    assert not blocks.allocate(b, 8, hits)
    assert b.block_table == [] and blocks.num_free_blocks == 3
    assert blocks.allocate(b, 4, hits)
    assert blocks.num_free_blocks == 0


def test_the_same_block_computed_twice_is_named_once() -> None:
    blocks = BlockManager(num_blocks=8, block_size=BS)
    a, b = make_seq("a", list(range(5))), make_seq("b", list(range(5)))
    # Admitted together, before either has written anything: no hits, two copies of the first block.
    for seq in (a, b):
        assert blocks.allocate(seq, 5)
    for seq in (a, b):
        blocks.cache_blocks(seq, 0, 5)
    assert blocks.prefix_cache.hash_of(a.block_table[0]) is not None
    assert blocks.prefix_cache.hash_of(b.block_table[0]) is None
    blocks.free(a)
    blocks.free(b)
    assert blocks.prefix_cache.num_evictable == 1 and len(blocks.free_block_ids) == 7


def test_reset_forgets_every_cached_block() -> None:
    blocks = BlockManager(num_blocks=8, block_size=BS)
    held, released = make_seq("held", list(range(9))), make_seq("released", [9] * 9)
    prefill(blocks, held)
    prefill(blocks, released)
    blocks.free(released)
    blocks.reset_prefix_cache()
    assert blocks.prefix_cache.num_evictable == 0 and len(blocks.free_block_ids) == 5
    assert blocks.find_cached_prefix(make_seq("p", list(range(9)))) == []
    blocks.free(held)  # its blocks lost their names, so they go to the free list
    assert len(blocks.free_block_ids) == 8


def test_caching_disabled_never_hits() -> None:
    blocks = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    prefill(blocks, make_seq("a", list(range(9))))
    assert blocks.find_cached_prefix(make_seq("b", list(range(9)))) == []


def test_kv_manifest_lists_blocks_with_content_hashes_for_transfer() -> None:
    blocks = BlockManager(num_blocks=8, block_size=BS)
    seq = make_seq("a", list(range(10)))
    prefill(blocks, seq)
    manifest = blocks.kv_manifest(seq)
    assert [block_id for block_id, _ in manifest] == seq.block_table
    first = hash_block_tokens(ROOT_HASH, [0, 1, 2, 3])
    assert [h for _, h in manifest] == [first, hash_block_tokens(first, [4, 5, 6, 7]), None]


def test_hit_rate_is_token_level() -> None:
    cache = PrefixCache()
    assert cache.hit_rate == 0.0
    cache.record_lookup(num_query_tokens=100, num_hit_tokens=0)
    cache.record_lookup(num_query_tokens=100, num_hit_tokens=96)
    assert cache.hit_rate == 96 / 200
