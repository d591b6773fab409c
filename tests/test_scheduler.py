"""The continuous-batching scheduler, driven by a fake model that really uses the paged block tables.

The fake model has layer groups like a real one (full attention, and sliding windows). It writes every scheduled
token id into a paged "KV cache" through each group's block table, checks that every key a query of the chunk
may attend (inside its window) reads back through the tables, then makes each sampled token a function of what
the last query reads: the whole context through the full-attention groups, the window through the sliding ones.
So a wrong block table, a reused page, a page released while still in the window, a stale prefix hit or a lost
token changes the output or fails a check, and each request's output must equal what the same function gives
on its own prompt, however requests were batched, chunked, cached, preempted or recomputed.
"""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ridgeline.engine.block_manager import RELEASED
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import ItlTarget, ScheduledChunk, Scheduler, SchedulerConfig, SchedulerOutput
from ridgeline.engine.sequence import Sequence, SequenceStatus
from ridgeline.errors import RidgelineError

EOS = 1
MAX_MODEL_LEN = 4096


GEMMA_LIKE = (None, 8, 8)  # a full-attention group, then two sliding-window groups


def key_begin(pos: int, window: int | None) -> int:
    """The first key the query at pos attends."""
    return 0 if window is None else max(0, pos - window + 1)


def next_token(reads: list[list[int]]) -> int:
    """The fake forward pass: a deterministic function of the keys the last query reads in each group; never EOS."""
    return 2 + sum((g + 1) * (i + 1) * t for g, keys in enumerate(reads) for i, t in enumerate(keys)) % 97


def expected_output(prompt: list[int], num_tokens: int, windows: tuple[int | None, ...] = (None,)) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(next_token([tokens[key_begin(len(tokens) - 1, window):] for window in windows]))
    return tokens[len(prompt) :]


class PagedFakeModel:
    def __init__(self, num_pages: int, block_size: int, windows: tuple[int | None, ...] = (None,)) -> None:
        self.block_size, self.windows = block_size, windows
        self.kv: list[tuple[int, int] | None] = [None] * (num_pages * block_size)  # (group, token id) per slot

    def _slot(self, block_table: tuple[int, ...], pos: int) -> int:
        page = block_table[pos // self.block_size]
        assert page != RELEASED, f"position {pos} is in a released page"
        return page * self.block_size + pos % self.block_size

    def _read(self, chunk: ScheduledChunk, group: int, begin: int, end: int) -> list[int]:
        keys = [self.kv[self._slot(chunk.block_tables[group], pos)] for pos in range(begin, end)]
        assert keys == [(group, t) for t in chunk.seq.token_ids[begin:end]], "a query reads wrong keys"
        return [token_id for _, token_id in keys]

    def forward(self, output: SchedulerOutput) -> list[int]:
        for chunk in output.chunks:  # every token's KV is written before anything attends, as in the runner
            assert len(chunk.block_tables) == len(self.windows)
            for group, table in enumerate(chunk.block_tables):
                for pos, token_id in enumerate(chunk.token_ids, start=chunk.start):
                    self.kv[self._slot(table, pos)] = (group, token_id)
        for chunk in output.chunks:  # every query of the chunk reads its window, the first one reaching furthest back
            for group, window in enumerate(self.windows):
                self._read(chunk, group, key_begin(chunk.start, window), chunk.start + chunk.num_tokens)
        # What the last query of each sampling chunk reads, group by group, decides its token.
        ends = [c.start + c.num_tokens for c in output.sampling_chunks]
        return [next_token([self._read(c, g, key_begin(end - 1, w), end) for g, w in enumerate(self.windows)])
                for c, end in zip(output.sampling_chunks, ends)]


def make_scheduler(num_pages: int = 256, max_model_len: int = MAX_MODEL_LEN, windows=(None,), block_size: int = 16,
                   step_cost=None, **config) -> Scheduler:
    ticks = itertools.count()
    return Scheduler(SchedulerConfig(**config), num_pages, max_model_len, eos_token_ids=[EOS],
                     clock=lambda: float(next(ticks)), windows=windows, block_size=block_size, step_cost=step_cost)


def linear_cost(step_s: float = 0.010, decode_s: float = 0.002, prompt_s: float = 0.001):
    """A step-cost model: a fixed cost per step, per decode row, per prompt token (the engine's estimate's form)."""
    return lambda chunks: step_s + sum(decode_s if n == 1 else prompt_s * n for _, n, _ in chunks)


def make_seq(request_id: str, prompt: list[int], max_tokens: int | None = 8, **params) -> Sequence:
    return Sequence(request_id, prompt, SamplingParams(max_tokens=max_tokens, **params), arrival_time=0.0)


def step(scheduler: Scheduler, model: PagedFakeModel) -> tuple[SchedulerOutput, list[Sequence]]:
    """One engine step, checking what must hold for every step."""
    config = scheduler.config
    decoding = {seq for seq in scheduler.running if seq.num_uncomputed_tokens == 1}
    output = scheduler.schedule()
    assert output.num_batched_tokens <= config.max_num_batched_tokens
    assert len(scheduler.running) <= config.max_num_seqs
    kinds = [chunk.seq in decoding for chunk in output.chunks]
    assert kinds == sorted(kinds, reverse=True), "decodes come before prefill chunks"
    if len(decoding) <= config.max_num_batched_tokens:
        scheduled = {chunk.seq for chunk in output.chunks}
        assert all(seq in scheduled or seq in output.preempted for seq in decoding), "no running decode is skipped"
    for chunk in output.chunks:
        assert chunk.start == chunk.seq.num_computed_tokens and chunk.num_tokens > 0
        assert chunk.samples == (chunk.start + chunk.num_tokens == chunk.seq.num_tokens)
        if not config.enable_chunked_prefill and chunk.seq.num_uncomputed_tokens <= config.max_num_batched_tokens:
            assert chunk.samples, "without chunked prefill a prompt is scheduled whole"
    return output, scheduler.update(output, model.forward(output))


def run_to_completion(scheduler: Scheduler, arrivals: dict[int, list[Sequence]], max_steps: int = 5000) -> list[Sequence]:
    """Add arrivals[k] before step k; step until everything finished; return every request."""
    blocks = scheduler.block_manager
    model = PagedFakeModel(blocks.num_pages, blocks.block_size, blocks.windows)
    everyone = []
    for step_index in range(max_steps):
        for seq in arrivals.get(step_index, []):
            scheduler.add_request(seq)
            everyone.append(seq)
        if not scheduler.has_unfinished() and step_index >= max(arrivals):
            return everyone
        step(scheduler, model)
    raise AssertionError("requests did not finish")


def assert_all_correct(scheduler: Scheduler, seqs: list[Sequence]) -> None:
    for seq in seqs:
        assert seq.status is SequenceStatus.FINISHED and seq.finish_reason == "length"
        room = scheduler.max_seq_len - seq.num_prompt_tokens
        windows = scheduler.block_manager.windows
        assert seq.output_token_ids == expected_output(seq.prompt_token_ids, min(seq.sampling_params.max_tokens, room), windows)
        assert seq.block_tables == []
    assert scheduler.block_manager.num_free_pages == scheduler.block_manager.num_pages, "a page leaked"


def mixed_workload() -> dict[int, list[Sequence]]:
    """Requests of many lengths, some sharing long prefixes, some arriving while others decode."""
    shared = [(7 * i) % 50 + 3 for i in range(40)]
    prompts = [shared + [5, 6], list(range(3, 70)), [9], shared + [8] * 30, shared[:17], list(range(100, 230)), shared + [5, 6], [4, 4]]
    seqs = [make_seq(f"r{i}", prompt, max_tokens=3 + 5 * (i % 4)) for i, prompt in enumerate(prompts)]
    return {0: seqs[:3], 2: seqs[3:5], 5: seqs[5:7], 9: seqs[7:]}


@pytest.mark.parametrize(
    "setup",
    [
        dict(),
        dict(max_num_batched_tokens=16),  # long prompts are chunked, several steps each
        dict(max_num_batched_tokens=160, enable_chunked_prefill=False),
        dict(enable_prefix_caching=False),
        dict(max_num_seqs=2),
        dict(block_size=4, max_num_batched_tokens=24),
        # Far fewer blocks than the requests need together: preemption and recomputation.
        dict(num_pages=38, block_size=4),
        dict(num_pages=45, block_size=4, max_num_batched_tokens=16),
        # Layer groups with sliding windows: pages below the window are released as sequences move on.
        dict(windows=GEMMA_LIKE),
        dict(windows=GEMMA_LIKE, block_size=4, max_num_batched_tokens=16),
        dict(windows=GEMMA_LIKE, num_pages=60, block_size=4, max_num_batched_tokens=16),
        dict(windows=(6, 13), num_pages=12, block_size=4, max_num_batched_tokens=8),
        # An ITL target cuts prefill beside decodes to a few tokens a step: same tokens, other chunks.
        dict(block_size=4, itl_target=ItlTarget(seconds=0.02), step_cost=linear_cost()),
        dict(num_pages=45, block_size=4, itl_target=ItlTarget(), step_cost=linear_cost()),
    ],
    ids=["default", "chunked-16", "no-chunking", "no-prefix-cache", "two-seqs", "block-4", "tiny-pool", "tiny-pool-chunked",
         "windows", "windows-chunked-16", "windows-tiny-pool", "sliding-only-tiny-pool", "itl-target",
         "itl-target-tiny-pool"],
)
def test_every_request_completes_with_the_tokens_it_would_get_alone(setup: dict) -> None:
    scheduler = make_scheduler(**setup)
    seqs = run_to_completion(scheduler, mixed_workload())
    assert_all_correct(scheduler, seqs)
    if "num_pages" in setup:
        assert scheduler.num_preemptions > 0
    if "itl_target" in setup:
        assert scheduler.num_prefilled_tokens > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(st.lists(st.integers(2, 9), min_size=1, max_size=60), min_size=1, max_size=8),
    max_tokens=st.lists(st.integers(1, 12), min_size=8, max_size=8),
    arrival_steps=st.lists(st.integers(0, 6), min_size=8, max_size=8),
    budget=st.integers(4, 64),
    num_pages=st.integers(6, 40),
    block_size=st.sampled_from([1, 2, 4, 16]),
    max_num_seqs=st.integers(1, 8),
    prefix_caching=st.booleans(),
    chunked_prefill=st.booleans(),
    windows=st.sampled_from([(None,), GEMMA_LIKE, (None, 3), (5, 11)]),
)
def test_random_workloads_complete_correctly_without_leaking_pages(
    prompts, max_tokens, arrival_steps, budget, num_pages, block_size, max_num_seqs, prefix_caching, chunked_prefill,
    windows,
) -> None:
    # Prompts drawn from few distinct ids often share prefixes, so hits and shared pages are common.
    scheduler = make_scheduler(
        num_pages=num_pages * len(windows),
        windows=windows,
        max_num_batched_tokens=budget,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=prefix_caching,
        enable_chunked_prefill=chunked_prefill,
    )
    longest = scheduler.max_seq_len - 1 if chunked_prefill else min(scheduler.max_seq_len - 1, budget)
    fitting = [p for p in prompts if len(p) <= longest]
    arrivals: dict[int, list[Sequence]] = {0: []}
    for i, prompt in enumerate(fitting):
        arrivals.setdefault(arrival_steps[i], []).append(make_seq(f"r{i}", prompt, max_tokens[i]))
    assert_all_correct(scheduler, run_to_completion(scheduler, arrivals))


def test_decodes_first_then_a_prefill_chunk_fills_the_rest_of_the_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=32)
    model = PagedFakeModel(256, 16)
    for i in range(3):
        scheduler.add_request(make_seq(f"d{i}", [2, 3, 4], max_tokens=20))
    step(scheduler, model)  # the three short prompts are prefilled together
    scheduler.add_request(make_seq("long", list(range(100))))
    output, _ = step(scheduler, model)
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in output.chunks] == [
        ("d0", 3, 1), ("d1", 3, 1), ("d2", 3, 1), ("long", 0, 29)
    ]


def test_long_prompt_is_chunked_and_only_its_last_chunk_samples() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=32)
    model = PagedFakeModel(256, 16)
    seq = make_seq("long", list(range(100)), max_tokens=2)
    scheduler.add_request(seq)
    chunks = [step(scheduler, model)[0].chunks for _ in range(5)]
    assert [(c.start, c.num_tokens, c.samples) for (c,) in chunks] == [
        (0, 32, False), (32, 32, False), (64, 32, False), (96, 4, True), (100, 1, True)
    ]
    assert seq.output_token_ids == expected_output(seq.prompt_token_ids, 2)


def test_without_chunking_a_prompt_waits_until_it_fits_whole() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=32, enable_chunked_prefill=False)
    model = PagedFakeModel(256, 16)
    scheduler.add_request(make_seq("a", [2, 3], max_tokens=3))
    scheduler.add_request(make_seq("b", [2, 4], max_tokens=3))
    step(scheduler, model)
    scheduler.add_request(make_seq("big", list(range(31)), max_tokens=1))
    output, _ = step(scheduler, model)  # two decodes leave 30 tokens: 31 do not fit, so it waits
    assert [c.seq.request_id for c in output.chunks] == ["a", "b"]
    while all(c.seq.request_id != "big" for c in output.chunks):
        output, _ = step(scheduler, model)
    (chunk,) = [c for c in output.chunks if c.seq.request_id == "big"]
    assert (chunk.start, chunk.num_tokens) == (0, 31)


def test_preemption_takes_the_most_recently_admitted_and_requeues_it_first() -> None:
    # 4 blocks of 4 tokens; two requests of 6 prompt tokens each hold 2 blocks; decoding soon needs a third.
    scheduler = make_scheduler(num_pages=4, block_size=4, enable_prefix_caching=False)
    model = PagedFakeModel(4, 4)
    first, second, third = (make_seq(n, [2, 3, 4, 5, 6, 7], max_tokens=6) for n in ("first", "second", "third"))
    for seq in (first, second, third):
        scheduler.add_request(seq)
    output, _ = step(scheduler, model)
    assert [c.seq for c in output.chunks] == [first, second]  # third waits: no blocks left
    while not output.preempted:
        output, _ = step(scheduler, model)
    assert output.preempted == [second]
    assert second.status is SequenceStatus.PREEMPTED and second.block_tables == [] and second.num_computed_tokens == 0
    assert list(scheduler.waiting) == [second, third]
    assert scheduler.num_preemptions == 1
    while scheduler.has_unfinished():
        step(scheduler, model)
    assert_all_correct(scheduler, [first, second, third])


def test_abort_frees_blocks_at_once_whether_waiting_prefilling_or_decoding() -> None:
    scheduler = make_scheduler(num_pages=64, max_num_batched_tokens=40)
    model = PagedFakeModel(64, 16)
    decoding = make_seq("decoding", list(range(20)), max_tokens=50)
    prefilling = make_seq("prefilling", list(range(100, 200)))
    waiting = make_seq("waiting", list(range(30)))
    for seq in (decoding, prefilling):
        scheduler.add_request(seq)
    step(scheduler, model)
    scheduler.add_request(waiting)
    output, _ = step(scheduler, model)
    assert 0 < prefilling.num_computed_tokens < prefilling.num_tokens and decoding.output_token_ids
    free_before = scheduler.block_manager.num_free_pages
    scheduler.abort("prefilling")
    (held_pages,) = output.chunks[1].block_tables
    assert scheduler.block_manager.num_free_pages == free_before + len(held_pages)
    output = scheduler.schedule()
    # Aborted between schedule() and update(): its blocks are free at once and update() skips it.
    scheduler.abort("decoding")
    scheduler.abort("waiting")
    scheduler.update(output, model.forward(output))
    for seq in (decoding, prefilling, waiting):
        assert seq.finish_reason == "abort" and seq.block_tables == []
    assert not scheduler.has_unfinished()
    assert scheduler.block_manager.num_free_pages == 64
    assert scheduler.abort("decoding") is None  # aborting twice is harmless


def test_prefix_hit_skips_the_cached_tokens() -> None:
    scheduler = make_scheduler(block_size=16)
    model = PagedFakeModel(256, 16)
    system_prompt = list(range(2, 50))  # three full blocks
    first = make_seq("first", system_prompt + [60, 61])
    scheduler.add_request(first)
    while scheduler.has_unfinished():
        step(scheduler, model)
    second = make_seq("second", system_prompt + [70, 71, 72])
    scheduler.add_request(second)
    output, _ = step(scheduler, model)
    (chunk,) = output.chunks
    assert (chunk.start, chunk.num_tokens) == (48, 3)
    assert second.num_cached_tokens == 48
    stats = scheduler.block_manager.prefix_cache
    assert (stats.num_query_tokens, stats.num_hit_tokens) == (50 + 51, 48)
    while scheduler.has_unfinished():
        step(scheduler, model)
    assert_all_correct(scheduler, [first, second])


def test_preempted_request_is_recomputed_with_prefix_hits_on_its_own_blocks() -> None:
    scheduler = make_scheduler(num_pages=6, block_size=4)
    model = PagedFakeModel(6, 4)
    old, new = make_seq("old", list(range(2, 12)), max_tokens=8), make_seq("new", list(range(20, 30)), max_tokens=8)
    for seq in (old, new):
        scheduler.add_request(seq)
    output, _ = step(scheduler, model)
    while not output.preempted:
        output, _ = step(scheduler, model)
    assert output.preempted == [new]
    num_tokens_when_preempted = new.num_tokens
    while new.status is not SequenceStatus.RUNNING:
        output, _ = step(scheduler, model)
    (chunk,) = [c for c in output.chunks if c.seq is new]
    assert chunk.start > 0 and chunk.start + chunk.num_tokens == num_tokens_when_preempted
    assert new.num_cached_tokens == 0  # the figure reported to the user is its first admission's
    while scheduler.has_unfinished():
        step(scheduler, model)
    assert_all_correct(scheduler, [old, new])


def test_fork_shares_the_prompt_and_computes_only_the_unshared_tail() -> None:
    scheduler = make_scheduler(block_size=4, enable_prefix_caching=False)
    model = PagedFakeModel(256, 4)
    parent = make_seq("parent", list(range(2, 12)), max_tokens=4)
    scheduler.add_request(parent)
    step(scheduler, model)
    child = make_seq("child", list(range(2, 12)), max_tokens=4)
    scheduler.add_request(child, fork_of="parent")
    (child_pages,), (parent_pages,) = child.block_tables, parent.block_tables
    assert child_pages == parent_pages[:2] and child.num_computed_tokens == 8
    assert [scheduler.block_manager.ref_counts[b] for b in parent_pages] == [2, 2, 1]
    output, _ = step(scheduler, model)
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in output.chunks] == [("parent", 10, 1), ("child", 8, 2)]
    while scheduler.has_unfinished():
        step(scheduler, model)
    assert_all_correct(scheduler, [parent, child])


@pytest.mark.parametrize("prompt_len", [10, 12, 41])  # a partial last block, an exact multiple, several chunks
def test_forks_queued_with_their_parent_wait_for_its_prompt_and_prefill_it_once(prompt_len: int) -> None:
    # The n samples of one prompt arrive together: the siblings wait until the first one's prompt is computed,
    # then share its full blocks and compute only the tail, however the prompt was chunked.
    scheduler = make_scheduler(block_size=4, enable_prefix_caching=False, max_num_batched_tokens=16)
    model = PagedFakeModel(256, 4)
    prompt = [(3 * i) % 17 + 2 for i in range(prompt_len)]
    parent = make_seq("s0", prompt, max_tokens=5)
    children = [make_seq(f"s{i}", prompt, max_tokens=5) for i in (1, 2, 3)]
    scheduler.add_request(parent)
    for child in children:
        scheduler.add_request(child, fork_of="s0")
    assert scheduler.num_waiting == 4
    computed = 0
    while scheduler.has_unfinished():
        output, _ = step(scheduler, model)
        computed += sum(min(c.num_tokens, max(0, c.seq.num_prompt_tokens - c.start)) for c in output.chunks)
    tail = prompt_len - ((prompt_len - 1) // 4) * 4  # what a fork recomputes: the last, partial or final, block
    assert computed == prompt_len + 3 * tail
    assert_all_correct(scheduler, [parent, *children])


def test_a_fork_whose_parent_ends_before_its_prompt_is_computed_runs_on_its_own() -> None:
    scheduler = make_scheduler(block_size=4, max_num_batched_tokens=8)
    model = PagedFakeModel(256, 4)
    prompt = list(range(2, 30))
    scheduler.add_request(make_seq("parent", prompt, max_tokens=3))
    child = make_seq("child", prompt, max_tokens=3)
    scheduler.add_request(child, fork_of="parent")
    step(scheduler, model)  # the parent's first chunk
    scheduler.abort("parent")
    orphan = make_seq("orphan", prompt, max_tokens=3)
    scheduler.add_request(orphan, fork_of="parent")  # the parent is gone: an ordinary request
    sibling = make_seq("sibling", prompt, max_tokens=3)
    scheduler.add_request(sibling, fork_of="orphan")
    scheduler.abort("sibling")  # aborted while it waits for its parent
    while scheduler.has_unfinished():
        step(scheduler, model)
    assert_all_correct(scheduler, [child, orphan])


def test_token_based_stop_conditions() -> None:
    scheduler = make_scheduler(max_model_len=20)
    eos = make_seq("eos", [3], max_tokens=None)
    ignores = make_seq("ignores", [3], max_tokens=3, ignore_eos=True)
    stop_id = make_seq("stop-id", [3], max_tokens=None, stop_token_ids=[EOS + 1])
    score_only = make_seq("score-only", [3, 4, 5], max_tokens=0)
    to_the_limit = make_seq("to-the-limit", [7] * 15, max_tokens=None)
    for seq in (eos, ignores, stop_id, score_only, to_the_limit):
        scheduler.add_request(seq)
    output = scheduler.schedule()
    assert [c.samples for c in output.chunks] == [True, True, True, False, True]
    scheduler.update(output, [EOS, EOS, EOS + 1, 9])
    assert (eos.finish_reason, eos.output_token_ids) == ("stop", [EOS])
    assert ignores.finish_reason is None
    assert (stop_id.finish_reason, stop_id.output_token_ids) == ("stop", [EOS + 1])
    assert (score_only.finish_reason, score_only.output_token_ids) == ("length", [])
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        scheduler.update(output, [9] * len(output.sampling_chunks))
    assert (ignores.finish_reason, ignores.output_token_ids) == ("length", [EOS, 9, 9])
    assert to_the_limit.finish_reason == "length" and to_the_limit.num_tokens == 20  # never past the context


def test_finish_request_ends_a_request_found_by_the_detokenizer() -> None:
    scheduler = make_scheduler()
    model = PagedFakeModel(256, 16)
    seq = make_seq("a", [2, 3, 4], max_tokens=10)
    scheduler.add_request(seq)
    for _ in range(3):
        step(scheduler, model)
    finished = scheduler.finish_request("a", "stop")
    assert finished is seq and seq.finish_reason == "stop" and seq.block_tables == []
    assert len(seq.output_token_ids) == 3 and not scheduler.has_unfinished()


def test_timestamps_follow_the_request_through_its_life() -> None:
    scheduler = make_scheduler()
    seq = make_seq("a", [2, 3, 4], max_tokens=3)
    run_to_completion(scheduler, {0: [seq]})
    assert seq.arrival_time <= seq.first_scheduled_time < seq.first_token_time <= seq.finish_time
    assert len(seq.token_times) == 3 and seq.token_times[0] == seq.first_token_time
    assert seq.token_times == sorted(seq.token_times)


def test_a_request_id_in_use_is_refused() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_seq("a", [2]))
    with pytest.raises(RidgelineError, match="already in use"):
        scheduler.add_request(make_seq("a", [3]))


def test_config_rejects_nonsense() -> None:
    with pytest.raises(RidgelineError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=0)


def test_sliding_windows_and_small_chunks_let_a_sequence_outgrow_the_pool_at_full_cost() -> None:
    # 30 pages of 4 tokens for a full-attention group and a sliding one (window 8): 60 tokens at full cost.
    small_chunks, big_chunks = (make_scheduler(num_pages=30, block_size=4, max_num_batched_tokens=budget, windows=(None, 8))
                                for budget in (4, 64))
    # A chunk holds the pages of all its tokens while it runs, in the sliding group too.
    assert big_chunks.max_seq_len == 60 < small_chunks.max_seq_len
    longest = make_seq("longest", [(5 * i) % 11 + 2 for i in range(small_chunks.max_seq_len - 10)], max_tokens=10)
    assert_all_correct(small_chunks, run_to_completion(small_chunks, {0: [longest]}))


def test_fork_shares_each_groups_pages_but_only_the_window_of_a_sliding_group() -> None:
    scheduler = make_scheduler(block_size=4, enable_prefix_caching=False, windows=(None, 8))
    model = PagedFakeModel(256, 4, (None, 8))
    parent = make_seq("parent", list(range(2, 32)), max_tokens=4)
    scheduler.add_request(parent)
    step(scheduler, model)
    child = make_seq("child", list(range(2, 32)), max_tokens=4)
    scheduler.add_request(child, fork_of="parent")
    # Seven full blocks (28 tokens) are shared; the child's next query (position 28) reads keys 21..28, so the
    # sliding group shares only blocks 5 and 6.
    assert child.num_computed_tokens == 28
    (child_full, child_sliding), (parent_full, parent_sliding) = child.block_tables, parent.block_tables
    assert child_full == parent_full[:7]
    assert child_sliding == [RELEASED] * 5 + parent_sliding[5:7]
    output, _ = step(scheduler, model)
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in output.chunks] == [("parent", 30, 1), ("child", 28, 2)]
    while scheduler.has_unfinished():
        step(scheduler, model)
    assert_all_correct(scheduler, [parent, child])


def itl_scheduler(target: ItlTarget, step_cost=None, **config) -> tuple[Scheduler, PagedFakeModel]:
    """Four streams decoding (after one step prefills their prompts) and a 400-token prompt waiting. The token
    budget is 256, so the least prefill beside decodes is one 16-token page (a sixteenth of the budget)."""
    config.setdefault("max_num_batched_tokens", 256)
    scheduler = make_scheduler(itl_target=target, step_cost=step_cost or linear_cost(), **config)
    model = PagedFakeModel(256, 16)
    for i in range(4):
        scheduler.add_request(make_seq(f"d{i}", [2, 3, 4], max_tokens=50))
    output, _ = step(scheduler, model)
    assert output.budget is None  # nothing decoded yet: prefill only, no limit
    scheduler.add_request(make_seq("long", list(range(400)), max_tokens=2))
    return scheduler, model


def prefill_tokens(output: SchedulerOutput) -> int:
    return sum(c.num_tokens for c in output.chunks if c.seq.request_id == "long")


def test_an_itl_target_caps_the_prefill_beside_decodes_to_the_predicted_step_time() -> None:
    # 10 ms a step + 4 decodes x 2 ms + n x 1 ms <= 50 ms: n = 32.
    scheduler, model = itl_scheduler(ItlTarget(seconds=0.050))
    output, _ = step(scheduler, model)
    assert [c.num_tokens for c in output.chunks] == [1, 1, 1, 1, 32]
    assert output.budget.prefill_limit == 32 and output.budget.target_s == 0.050
    assert output.budget.predicted_s == pytest.approx(0.050)


def test_the_default_target_is_a_multiple_of_the_decode_step_the_queue_heads_to() -> None:
    # Four decoding and the long prompt waiting: five decodes alone take 10 + 5 x 2 = 20 ms; 1.75x that = 35 ms,
    # less the four decodes of this step (18 ms), leaves 17 ms: 17 prompt tokens.
    scheduler, model = itl_scheduler(ItlTarget())
    output, _ = step(scheduler, model)
    assert prefill_tokens(output) == 17
    assert output.budget.target_s == pytest.approx(0.035)
    # More prompts waiting: the batch they make decodes slower, and the target follows (up to max_num_seqs).
    for i in range(4):
        scheduler.add_request(make_seq(f"w{i}", list(range(40)), max_tokens=2))
    output, _ = step(scheduler, model)
    assert output.budget.target_s == pytest.approx(1.75 * (0.010 + 9 * 0.002))
    capped, capped_model = itl_scheduler(ItlTarget(), max_num_seqs=5)
    for i in range(4):
        capped.add_request(make_seq(f"w{i}", list(range(40)), max_tokens=2))
    output, _ = step(capped, capped_model)
    assert output.budget.target_s == pytest.approx(0.035)


def test_without_decodes_prefill_takes_the_whole_budget() -> None:
    scheduler = make_scheduler(itl_target=ItlTarget(seconds=0.001), step_cost=linear_cost(), max_num_batched_tokens=300)
    scheduler.add_request(make_seq("long", list(range(400)), max_tokens=2))
    output, _ = step(scheduler, PagedFakeModel(256, 16))
    assert output.num_batched_tokens == 300 and output.budget is None


@pytest.mark.parametrize("budget,least", [(256, 16), (1024, 64), (2048, 128)])
def test_a_big_backlog_never_advances_by_less_than_a_sixteenth_of_the_budget(budget, least) -> None:
    # A target the decodes alone already miss: the prompt still advances every step, and with a backlog of 16
    # budgets' sixteenths or more (here 20 prompts of 400 tokens) by the budget's sixteenth.
    scheduler, model = itl_scheduler(ItlTarget(seconds=0.001), block_size=16, max_num_batched_tokens=budget)
    for i in range(19):
        scheduler.add_request(make_seq(f"w{i}", list(range(400)), max_tokens=2))
    for _ in range(3):
        output, _ = step(scheduler, model)
        assert prefill_tokens(output) == least and output.budget.prefill_limit == least


@pytest.mark.parametrize("backlog,least", [(100, 16), (400, 25), (1600, 100), (4000, 128)])
def test_a_small_backlog_advances_by_a_sixteenth_of_itself_and_at_least_a_page(backlog, least) -> None:
    # One short prompt joining the streams goes in slices (its streams' gaps stay even) rather than in one step
    # of the budget's sixteenth, and is still through in ~16 steps however tight the target.
    scheduler = make_scheduler(itl_target=ItlTarget(seconds=0.001), step_cost=linear_cost(), block_size=16,
                               max_num_batched_tokens=2048)
    model = PagedFakeModel(1024, 16)
    for i in range(4):
        scheduler.add_request(make_seq(f"d{i}", [2, 3, 4], max_tokens=50))
    step(scheduler, model)
    scheduler.add_request(make_seq("long", list(range(backlog)), max_tokens=2))
    output, _ = step(scheduler, model)
    assert prefill_tokens(output) == least and output.budget.prefill_limit == least


def test_decode_steps_with_nothing_to_prefill_carry_no_budget() -> None:
    scheduler, model = itl_scheduler(ItlTarget(seconds=0.05))
    scheduler.abort("long")
    output, _ = step(scheduler, model)
    assert output.num_batched_tokens == 4 and output.budget is None


def test_until_the_step_cost_can_predict_prefill_beside_decodes_takes_one_page() -> None:
    scheduler, model = itl_scheduler(ItlTarget(), step_cost=lambda chunks: None)
    output, _ = step(scheduler, model)
    assert prefill_tokens(output) == 16
    assert output.budget.target_s is None and output.budget.predicted_s is None


def test_an_itl_target_changes_chunks_not_tokens() -> None:
    def run(**config) -> list[list[int]]:
        scheduler = make_scheduler(block_size=4, **config)
        seqs = run_to_completion(scheduler, mixed_workload())
        assert_all_correct(scheduler, seqs)
        return [seq.output_token_ids for seq in seqs]

    assert run(itl_target=ItlTarget(seconds=0.015), step_cost=linear_cost()) == run()


def test_an_itl_target_needs_chunked_prefill_and_a_step_cost_model() -> None:
    with pytest.raises(RidgelineError, match="chunked prefill"):
        SchedulerConfig(itl_target=ItlTarget(), enable_chunked_prefill=False)
    with pytest.raises(RidgelineError, match="step-cost model"):
        make_scheduler(itl_target=ItlTarget())
    with pytest.raises(RidgelineError, match="positive"):
        ItlTarget(seconds=0)
    with pytest.raises(RidgelineError, match="exceed 1"):
        ItlTarget(decode_multiple=1.0)
