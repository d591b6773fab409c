"""The router's decisions without engines: tier choice and its calibration, load counted at dispatch and
corrected by reports, the prefix index, health and the config file."""

import numpy as np
import pytest

from ridgeline.cluster.affinity import PrefixIndex, prompt_block_hashes
from ridgeline.cluster.config import load_config, parse_config
from ridgeline.cluster.health import Health
from ridgeline.cluster.load import LoadTracker
from ridgeline.cluster.messages import CacheEvents
from ridgeline.cluster.tier_policy import TierCandidate, calibrate, decide, difficulty, large_share
from ridgeline.engine.block_manager import BlockManager
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.sequence import Sequence
from ridgeline.errors import RidgelineError


def tiers(prompt_tokens: int, small_rate=4000.0, large_rate=800.0, queue_large=0.0):
    return [TierCandidate("small", 0.4, prompt_tokens / small_rate + 64 / 150),
            TierCandidate("large", 0.7, queue_large + prompt_tokens / large_rate + 64 / 40)]


def test_long_and_hard_prompts_go_to_the_large_model_short_ones_to_the_small():
    assert decide(tiers(6), difficulty(6, "hi there"), 0.05).model == "small"
    hard = "Explain step by step why the proof works, then derive the bound. " * 20
    assert decide(tiers(900), difficulty(900, hard), 0.05).model == "large"
    assert difficulty(900, hard) > difficulty(900, "a" * 10) > difficulty(6, "hi")


def test_a_busy_large_model_sends_more_to_the_small_one():
    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 1500, 400)
    idle = [(difficulty(int(n)), tiers(int(n))) for n in lengths]
    busy = [(difficulty(int(n)), tiers(int(n), queue_large=3.0)) for n in lengths]
    threshold = calibrate(idle, 0.5)
    assert large_share(busy, threshold) < large_share(idle, threshold)


@pytest.mark.parametrize("target", [0.1, 0.3, 0.7])
def test_calibration_hits_the_target_share_of_large_model_calls(target):
    rng = np.random.default_rng(1)
    sample = [(difficulty(int(n)), tiers(int(n))) for n in rng.lognormal(4.5, 1.2, 500).astype(int) + 1]
    threshold = calibrate(sample, target)
    assert abs(large_share(sample, threshold) - target) <= 0.03
    held_out = [(difficulty(int(n)), tiers(int(n))) for n in rng.lognormal(4.5, 1.2, 500).astype(int) + 1]
    assert abs(large_share(held_out, threshold) - target) <= 0.08


def test_decision_says_why():
    decision = decide(tiers(20), difficulty(20), 1.0)
    assert decision.model == "small" and decision.kind == "cost" and "large" in decision.reason
    assert set(decision.as_log()["costs_s"]) == {"small", "large"}


def test_load_is_counted_at_dispatch_and_corrected_by_reports():
    loads = LoadTracker()
    for i, tokens in enumerate([100, 200, 300]):
        loads.dispatched("r", f"q{i}", tokens)
    assert loads.of("r").prefill_backlog == 600 and loads.of("r").num_in_flight == 3
    # The worker: q0 mostly cached, q1 not yet looked at, q2 not arrived (absent) - each keeps the router's count
    # unless named with a figure.
    loads.report("r", {"q0": 40, "q1": None})
    assert loads.of("r").prefill_backlog == 40 + 200 + 300
    loads.first_token("r", "q0")
    assert loads.of("r").prefill_backlog == 500 and loads.of("r").num_decoding == 1
    loads.report("r", {"q0": 0, "q1": 200, "q2": 300})  # a report never brings back a request past its prefill
    assert loads.of("r").prefill_backlog == 500
    for i in range(3):
        loads.done("r", f"q{i}")
    assert loads.of("r").num_in_flight == 0 and loads.of("r").prefill_backlog == 0


def test_a_reported_backlog_is_not_counted_after_its_requests_finish():
    """The stale-load bug: a backlog reported once per health check stayed counted until the next report although
    the requests behind it had been prefilled and finished. Now each request's count ends with it."""
    loads = LoadTracker()
    loads.dispatched("r", "q0", 1000)
    loads.report("r", {"q0": 1000})
    loads.first_token("r", "q0")
    assert loads.of("r").prefill_backlog == 0
    loads.dispatched("r", "q1", 16)  # sent after the report, with its prefix cached
    loads.done("r", "q0")
    assert loads.of("r").prefill_backlog == 16


def test_prompt_hashes_are_the_engine_block_hashes():
    tokens = list(range(3, 3 + 50))
    manager = BlockManager(16, block_size=8)
    seq = Sequence("s", tokens, SamplingParams(), 0.0)
    engine_hashes = manager.block_hashes(seq, len(tokens) // 8)
    ours = prompt_block_hashes(tokens, 8)
    assert ours == engine_hashes[: (len(tokens) - 1) // 8]


def test_prefix_index_matches_the_leading_chain_only():
    chain = prompt_block_hashes(list(range(3, 70)), 16)
    index = PrefixIndex()
    index.apply("r", CacheEvents(stored=chain[:3]))
    assert index.cached_blocks("r", chain) == 3
    index.apply("r", CacheEvents(removed=[chain[1]]))
    assert index.cached_blocks("r", chain) == 1  # a gap ends the usable prefix
    index.apply("r", CacheEvents(stored=[chain[0]], cleared=True))
    assert index.num_blocks("r") == 1
    index.forget("r")
    assert index.cached_blocks("r", chain) == 0


def test_a_prefix_sent_counts_as_held_until_the_report_after_its_request_ends():
    tokens = list(range(3, 70))
    chain = prompt_block_hashes(tokens, 16)
    index = PrefixIndex()
    index.expect("r", "req-1", chain)
    index.expect("r", "req-2", chain[:2])
    assert index.match(["r", "s"], tokens, 16) == {"r": 64, "s": 0}  # before any report
    index.ended("req-1")
    assert index.cached_blocks("r", chain) == 4  # ended, but its blocks are not yet confirmed either way
    index.apply("r", CacheEvents(stored=chain[:3]))  # the worker kept three blocks
    assert index.cached_blocks("r", chain) == 3
    index.apply("r", CacheEvents(removed=chain[:3]))
    assert index.cached_blocks("r", chain) == 2  # req-2 is still in flight: its two blocks are still expected
    index.forget("r")
    assert index.cached_blocks("r", chain) == 0


def test_busy_replica_is_skipped_until_retry_after():
    health = Health()
    health.busy(2.0, now=100.0)
    assert not health.usable(101.0) and health.usable(102.5) and health.up


def test_config_reads_backends_and_refuses_mistakes(tmp_path):
    path = tmp_path / "router.toml"
    path.write_text('[router]\nthreshold = 0.1\n[[backend]]\nmodel = "a"\npath = "a.gguf"\nreplicas = 2\n'
                    '[[backend]]\nmodel = "b"\nkind = "openai"\nurl = "http://127.0.0.1:9"\n')
    config = load_config(path)
    assert config.router.threshold == 0.1 and list(config.models()) == ["a", "b"]
    assert config.resolve("a.gguf") == str(tmp_path / "a.gguf")
    with pytest.raises(RidgelineError, match="unknown key"):
        parse_config({"backend": [{"model": "a", "replica": 2}]})
    with pytest.raises(RidgelineError, match="needs a url"):
        parse_config({"backend": [{"model": "a", "kind": "openai"}]})
    with pytest.raises(RidgelineError, match="'auto'"):
        parse_config({"backend": [{"model": "auto"}]})
    with pytest.raises(RidgelineError, match="no \\[\\[backend\\]\\]"):
        parse_config({"router": {}})


def test_match_finds_each_replicas_cached_prefix_in_tokens():
    tokens = list(range(3, 3 + 100))
    chain = prompt_block_hashes(tokens, 16)
    index = PrefixIndex()
    index.apply("a", CacheEvents(stored=chain[:4]))
    index.apply("b", CacheEvents(stored=chain[:1] + chain[2:]))
    assert index.match(["a", "b", "c"], tokens, 16) == {"a": 64, "b": 16, "c": 0}


def test_first_measurement_replaces_the_prior_later_ones_blend_in():
    from ridgeline.cluster.rates import Rates

    rates = Rates(100_000.0, 100_000.0, "roofline")
    rates.observe(100, 0.1, 0, None)  # a prefill-only sample leaves decode's prior alone...
    assert rates.prefill_tokens_per_s == 1000 and rates.decode_tokens_per_s == 100_000
    rates.observe(0, None, 10, 0.5)  # ...and decode's first sample still replaces it
    assert rates.decode_tokens_per_s == 20
    rates.observe(100, 0.05, 10, 0.25)
    assert 1000 < rates.prefill_tokens_per_s < 2000 and 20 < rates.decode_tokens_per_s < 40


def test_prefill_is_learnt_per_uncached_token_not_per_whole_step():
    """Cache hits (16 uncached tokens) each wait out a 100 ms step; misses prefill 1,000 tokens at 1,000 tok/s on
    top of it. Tokens over seconds per request would say ~160 tok/s for the hits; the fit finds the 1,000."""
    from ridgeline.cluster.rates import Rates

    rates = Rates(78.0, 10.0, "roofline")
    for i in range(30):
        tokens = 1000 if i % 4 == 0 else 16
        rates.observe(tokens, 0.1 + tokens / 1000, 0, None)
    assert rates.prefill_tokens_per_s == pytest.approx(1000, rel=0.01)
    assert rates.prefill_fixed_s == pytest.approx(0.1, rel=0.01)


# ------------------------------------------------------------ replica choice: prefix affinity against load
# Fake replicas: a LoadTracker and a PrefixIndex fed by hand, rates fixed at 1,000 prefill tokens/s so that a
# backlog of N tokens is N ms of queue.

def _replica_state(holder_backlog: int, other_backlog: int = 0):
    from ridgeline.cluster.rates import Rates

    loads, index = LoadTracker(), PrefixIndex()
    rates = {name: Rates(1000.0, 50.0, "configured") for name in ("holder", "other")}
    if holder_backlog:
        loads.dispatched("holder", "ahead", holder_backlog)
    if other_backlog:
        loads.dispatched("other", "ahead-other", other_backlog)
    return loads, index, rates


def _rank(prompt_tokens: int, cached: dict[str, int], loads, index, rates, caches=None):
    from ridgeline.cluster.replica_policy import rank_replicas

    return rank_replicas(["holder", "other"], prompt_tokens, 8, cached, index, loads, rates, caches)


def test_a_turn_stays_with_its_prefix_while_the_holder_is_still_prefilling_it():
    # The holder's queue is the prefix's own first prefill (290 tokens); the other replica is idle. For this turn
    # alone the two are about a wash (wait 290 there, or prefill 280 here), but a copy evicts other prefixes from a
    # full cache and splits this prefix's traffic, so it stays.
    loads, index, rates = _replica_state(holder_backlog=290)
    ranked = _rank(300, {"holder": 280, "other": 0}, loads, index, rates)
    assert ranked[0].replica == "holder"
    other = ranked[1]
    assert other.cost.total_s < ranked[0].cost.total_s  # the greedy per-request cost alone would have moved it
    assert other.copy_s == pytest.approx(0.28)  # charged for repeating the 280 held tokens


def test_a_prefix_moves_only_when_the_holders_queue_outweighs_twice_the_prefill_it_saves():
    saved = 280
    for backlog, expected in [(2 * saved - 40, "holder"), (2 * saved + 40, "other")]:
        loads, index, rates = _replica_state(holder_backlog=backlog)
        assert _rank(300, {"holder": saved, "other": 0}, loads, index, rates)[0].replica == expected, backlog


def test_prompts_no_replica_holds_are_placed_by_counted_load_alone():
    loads, index, rates = _replica_state(holder_backlog=50)  # "holder" holds nothing of this prompt
    ranked = _rank(300, {"holder": 0, "other": 0}, loads, index, rates)
    assert ranked[0].replica == "other"
    assert all(choice.copy_s == 0 for choice in ranked)
    assert all(choice.score == choice.cost.total_s for choice in ranked)


def test_a_replica_holding_part_of_a_prefix_is_charged_only_for_the_part_another_holds_beyond_it():
    loads, index, rates = _replica_state(holder_backlog=0)
    ranked = {c.replica: c for c in _rank(300, {"holder": 280, "other": 160}, loads, index, rates)}
    assert ranked["holder"].copy_s == 0 and ranked["other"].copy_s == pytest.approx(0.12)


def test_auto_reads_the_question_in_the_last_user_turn_however_much_comes_before_it():
    from ridgeline.cluster.build import question_text
    from ridgeline.cluster.tier_policy import MARKER_HEAD_CHARS, MARKER_TAIL_CHARS, count_markers

    system = "You are a helpful assistant who answers politely. " * 200  # 10,000 characters, no marker
    chat = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello."},
                         {"role": "assistant", "content": "Hi."},
                         {"role": "user", "content": [{"type": "text", "text": "Explain why the sky is blue."}]}]}
    assert question_text(chat) == "Explain why the sky is blue."
    assert count_markers(question_text(chat)) == 2
    assert difficulty(20, question_text(chat)) > difficulty(20, system)
    # A long paste: the question at its end, or at its start, is found; the scan covers both ends of the turn.
    paste = "the results table lists each run and its figures in order. " * 400  # 24,000 characters
    assert len(paste) > MARKER_HEAD_CHARS + MARKER_TAIL_CHARS and count_markers(paste) == 0
    assert count_markers(paste + " Why does the third run fail?") == 1
    assert count_markers("Explain this log: " + paste) == 1
    assert count_markers("prove it " * 10) == 2  # counted up to two: more add nothing
    assert question_text({"prompt": "Solve x"}) == "Solve x" and question_text({"prompt": [1, 2]}) == ""


class Words:
    """A tokenizer whose tokens are words (the router only asks it for a count)."""

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        return [0] * len(text.split())


def test_auto_counts_a_prompt_in_each_tier_s_own_tokens_where_it_holds_the_tokenizer():
    from ridgeline.cluster.rates import Rates
    from ridgeline.cluster.router import COUNT_CHARS, ModelGroup, Router

    class Fake:
        def __init__(self, name, model):
            self.name, self.model, self.kind = name, model, "engine"

    groups = [ModelGroup("small", 0.5, [Fake("small/0", "small")], tokenizer=Words()),
              ModelGroup("remote", 0.9, [Fake("remote/0", "remote")], chars_per_token=3.0)]
    router = Router(groups, {"small/0": Rates(2000.0, 100.0, "configured"), "remote/0": Rates(1000.0, 50.0, "configured")},
                    health_interval_s=3600, learn_rates=False)
    text = "antidisestablishmentarianism " * 100  # 100 tokens of 29 characters: characters / 4 says 725
    assert router.count_prompt_tokens(text) == {"small": 100, "remote": round(len(text) / 3.0)}
    decision = router.decide_auto(router.count_prompt_tokens(text), 10, "why")
    assert decision.difficulty == pytest.approx(difficulty(100, "why"))
    # Past COUNT_CHARS the count is scaled from the part tokenized.
    long = "word " * (COUNT_CHARS // 2)
    assert router.count_prompt_tokens(long)["small"] == pytest.approx(COUNT_CHARS // 2, rel=0.001)


def _fill(index: PrefixIndex, replica: str, prefixes: int, blocks: int = 18) -> None:
    """`prefixes` system prompts of `blocks` blocks of 16 reported held by `replica`."""
    for k in range(prefixes):
        index.apply(replica, CacheEvents(stored=prompt_block_hashes([k + 3 + 1000 * len(replica)] * (16 * blocks + 1), 16)))


def test_a_new_prefix_goes_where_it_evicts_nothing_though_the_other_replica_looks_a_little_less_busy():
    # "holder" holds four prefixes and has no room for a fifth; "other" holds three. A prompt nobody holds, with
    # "other" a few milliseconds busier (one more stream decoding, a few tokens of backlog): by counted load alone
    # it went to the full cache, evicted a prefix there, and the turns on that prefix prefilled it again.
    loads, index, rates = _replica_state(holder_backlog=0, other_backlog=20)
    _fill(index, "holder", 4)
    _fill(index, "other", 3)
    caches = {"holder": (16, 80), "other": (16, 80)}
    ranked = _rank(290, {"holder": 0, "other": 0}, loads, index, rates, caches)
    assert ranked[0].replica == "other"
    by_name = {c.replica: c for c in ranked}
    assert by_name["holder"].evict_s == pytest.approx((72 + 18 - 80) * 16 / 1000)  # the 10 blocks past its room
    assert by_name["other"].evict_s == 0
    # Without a cache size (an OpenAI server), counted load decides, as before.
    assert _rank(290, {"holder": 0, "other": 0}, loads, index, rates)[0].replica == "holder"


def test_the_eviction_charge_leaves_a_held_prefix_to_the_copy_charge_and_both_full_caches_to_load():
    loads, index, rates = _replica_state(holder_backlog=0, other_backlog=20)
    _fill(index, "holder", 5)
    _fill(index, "other", 5)
    caches = {"holder": (16, 80), "other": (16, 80)}
    ranked = _rank(290, {"holder": 0, "other": 0}, loads, index, rates, caches)
    assert ranked[0].replica == "holder"  # both full: the same charge on each, so the load decides
    assert ranked[0].evict_s == ranked[1].evict_s == pytest.approx(18 * 16 / 1000)
    # A turn on a prefix "holder" holds: "other" pays copy_s for the 17 held blocks, and evict_s only for the block
    # nobody holds; "holder" for that one block too.
    ranked = {c.replica: c for c in _rank(290, {"holder": 272, "other": 0}, loads, index, rates, caches)}
    assert ranked["other"].copy_s == pytest.approx(0.272) and ranked["other"].evict_s == pytest.approx(0.016)
    assert ranked["holder"].evict_s == pytest.approx(0.016)


def test_blocks_sent_to_a_replica_count_against_its_room_until_its_report_says_what_it_kept():
    tokens = list(range(3, 70))
    chain = prompt_block_hashes(tokens, 16)
    index = PrefixIndex()
    index.apply("r", CacheEvents(stored=chain[:1]))
    index.expect("r", "req-1", chain)
    index.expect("r", "req-2", chain[:2])
    assert index.blocks_in_use("r") == 4  # one reported, three more on their way (counted once however many bring them)
    index.ended("req-1")
    index.apply("r", CacheEvents(stored=chain[1:3]))  # req-1's report: it kept three of its four
    assert index.blocks_in_use("r") == 3
    index.ended("req-2")
    index.apply("r", CacheEvents(removed=chain[:1]))
    assert index.blocks_in_use("r") == 2
    index.forget("r")
    assert index.blocks_in_use("r") == 0
