"""Priority scheduling (SamplingParams.priority, vLLM's semantics: lower is served first, default 0).

Property tests drive the scheduler alone through the paged fake model of test_scheduler.py (so every output is
still checked against the tokens the request gets alone): equal priorities keep first come, first served and
nobody starves; a request is never admitted while one of higher priority waits; a preemption takes the lowest
priority, and a request is never preempted to admit one of its own priority or a lower one. Then the tiny model:
greedy outputs with mixed priorities are those of each prompt alone; and the server takes `priority`.
"""

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import ItlTarget, Scheduler, SchedulerConfig
from ridgeline.engine.sequence import Sequence, SequenceStatus
from ridgeline.errors import InvalidParameterError
from server_helpers import serve_tiny_model, tiny_engine
from test_scheduler import EOS, MAX_MODEL_LEN, PagedFakeModel, assert_all_correct, linear_cost, make_scheduler, make_seq, step

# (arrival step, prompt length, max_tokens, priority)
REQUEST = st.tuples(st.integers(0, 12), st.integers(1, 40), st.integers(1, 10), st.integers(-2, 2))
SETUP = dict(
    num_pages=st.integers(8, 40),
    block_size=st.sampled_from([2, 4, 8]),
    max_num_batched_tokens=st.integers(8, 64),
    max_num_seqs=st.integers(1, 6),
    enable_prefix_caching=st.booleans(),
)


def drive(scheduler: Scheduler, requests: list[tuple[int, int, int, int]], check_step=None,
          max_steps: int = 4000) -> list[Sequence]:
    """Add each request at its arrival step and step until all finish, calling check_step(before, output, after)
    with the queue and batch around each step; returns the requests in arrival order."""
    blocks = scheduler.block_manager
    model = PagedFakeModel(blocks.num_pages, blocks.block_size, blocks.windows)
    arrivals = sorted(range(len(requests)), key=lambda i: requests[i][0])
    everyone: list[Sequence] = []
    last_arrival = max(arrival for arrival, *_ in requests)
    for step_index in range(max_steps):
        for i in arrivals:
            arrival, prompt_len, max_tokens, priority = requests[i]
            if arrival == step_index:
                prompt = [2 + (i * 7 + j) % 50 for j in range(prompt_len)]
                # Within what the pool can ever hold, so every request can finish.
                prompt = prompt[:scheduler.max_seq_len - 1]
                seq = make_seq(f"r{i}", prompt, max_tokens=max_tokens, priority=priority)
                scheduler.add_request(seq)
                everyone.append(seq)
        if not scheduler.has_unfinished() and step_index >= last_arrival:
            return everyone
        before = (list(scheduler.waiting), list(scheduler.running))
        output, _ = step(scheduler, model)
        assert [s.priority for s in scheduler.waiting] == sorted(s.priority for s in scheduler.waiting), \
            "the queue is kept in priority order"
        if check_step is not None:
            check_step(before, output, (list(scheduler.waiting), list(scheduler.running)))
    raise AssertionError("requests did not finish (starvation or a stuck queue)")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(REQUEST, min_size=1, max_size=14), priority=st.integers(-5, 5), **SETUP)
def test_equal_priorities_are_first_come_first_served_and_all_finish(requests, priority, **setup) -> None:
    scheduler = make_scheduler(**setup)
    same = [(arrival, prompt_len, max_tokens, priority) for arrival, prompt_len, max_tokens, _ in requests]
    admitted: list[Sequence] = []

    def first_admissions(before, output, after):
        admitted.extend(c.seq for c in output.chunks if c.seq not in admitted and c.seq in before[0])

    everyone = drive(scheduler, same, first_admissions)
    assert_all_correct(scheduler, everyone)
    assert admitted == everyone, "first admitted in arrival order"

    # ... and exactly the schedule of the default priority (0): the same chunks, step by step.
    def chunks_into(sink):
        return lambda before, output, after: sink.append([(c.seq.request_id, c.start, c.num_tokens)
                                                          for c in output.chunks])
    steps_given, steps_default = [], []
    drive(make_scheduler(**setup), same, chunks_into(steps_given))
    drive(make_scheduler(**setup), [(a, p, m, 0) for a, p, m, _ in same], chunks_into(steps_default))
    assert steps_given == steps_default


# With an ITL target the background rule applies too: a fixed target (20 ms: 10 ms a step, 2 ms a decode row, 1 ms
# a prompt token) or the default multiple of the decode step; no memory of earlier steps (priority_hold_s=0), so the
# most urgent priority of a step is that of the requests there before it.
TARGETS = st.sampled_from([None, ItlTarget(seconds=0.020), ItlTarget()])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(REQUEST, min_size=1, max_size=14), target=TARGETS, **SETUP)
def test_mixed_priorities_admit_by_priority_and_preempt_the_lowest(requests, target, **setup) -> None:
    cost = linear_cost()
    scheduler = make_scheduler(**setup, itl_target=target, step_cost=cost if target else None, priority_hold_s=0)

    def check(before, output, after):
        waiting_before, running_before = before
        waiting_after, running_after = after
        admitted = [seq for seq in waiting_before if seq.status is SequenceStatus.RUNNING or
                    (seq.is_finished and any(c.seq is seq for c in output.chunks))]
        if admitted and waiting_after:
            # Nobody got in while a request of higher priority (a smaller value) still waits.
            assert max(s.priority for s in admitted) <= min(s.priority for s in waiting_after)
        if waiting_after and not output.preempted:
            # A step's prefill tokens go by priority too: no prompt of a lower priority than one left waiting got a
            # chunk (a batch tenant's long prompt does not take every step while an interactive request waits) --
            # unless that prompt is computing the waiting one's prefix, which it then waits for (prefix caching).
            bs = scheduler.block_manager.block_size
            urgent = [w for w in waiting_after if w.priority == min(s.priority for s in waiting_after)]
            assert not [c for c in output.chunks if c.seq in running_before and c.num_tokens > 1
                        and c.seq.priority > urgent[0].priority
                        and not (setup["enable_prefix_caching"] and any(
                            c.seq.token_ids[:bs] == w.token_ids[:bs] for w in urgent))]
        if target is not None and target.seconds is not None and output.chunks:
            # Prompt tokens of a lower priority than the most urgent request there take what keeps the step within
            # the target, or one token (the background always advances). Priced as the scheduler prices a step's
            # prefill: as one chunk (several short ones would each pay a decode row's price here).
            urgent = min(seq.priority for seq in waiting_before + running_before)
            background = [c for c in output.chunks if c.seq.priority > urgent
                          and not (c.seq in running_before and c.num_tokens == 1 and c.samples)]
            tokens = sum(c.num_tokens for c in background)
            rest = [c.step_chunk for c in output.chunks if c not in background]
            assert tokens <= 1 or cost(rest + [(0, tokens, True)]) <= target.seconds + 1e-9
        for victim in output.preempted:
            # The victim had the lowest priority of all that keep running ...
            assert all(seq.priority <= victim.priority for seq in running_after)
            # ... and nobody of its own priority or a lower one was admitted in its place.
            assert all(seq.priority < victim.priority for seq in admitted)

    everyone = drive(scheduler, requests, check)
    assert_all_correct(scheduler, everyone)  # each request's tokens are those it gets alone
    assert scheduler.block_manager.num_free_pages == scheduler.block_manager.num_pages


def test_an_urgent_prompt_is_prefilled_before_a_lower_priority_prompt_already_running() -> None:
    scheduler = make_scheduler(num_pages=64, block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
                               enable_prefix_caching=False)
    model = PagedFakeModel(64, 4)
    batch = make_seq("batch", list(range(2, 66)), max_tokens=4, priority=5)  # 64 tokens: four steps' budget
    scheduler.add_request(batch)
    step(scheduler, model)
    urgent = make_seq("urgent", list(range(70, 78)), max_tokens=2, priority=-1)
    scheduler.add_request(urgent)
    output, _ = step(scheduler, model)
    assert [(c.seq, c.num_tokens) for c in output.chunks] == [(urgent, 8), (batch, 8)]
    # With one priority the prompt admitted first keeps the budget (first come, first served), as before.
    scheduler = make_scheduler(num_pages=64, block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
                               enable_prefix_caching=False)
    first, second = make_seq("first", list(range(2, 66)), max_tokens=4), make_seq("second", list(range(70, 78)))
    scheduler.add_request(first)
    step(scheduler, model := PagedFakeModel(64, 4))
    scheduler.add_request(second)
    output, _ = step(scheduler, model)
    assert [(c.seq, c.num_tokens) for c in output.chunks] == [(first, 16)]


def test_a_lower_priority_prompt_gets_what_keeps_the_urgent_streams_at_their_own_target() -> None:
    # Two urgent streams decode while a long low-priority prompt is prefilled (the tenants benchmark's load). Their
    # own decode step is 10 + 2 x 2 = 14 ms, so their target is 1.75 x 14 = 24.5 ms: the prompt gets 10 tokens
    # (24 ms). The same requests at one priority get the step's floor instead, a page (16 tokens: 30 ms), beyond
    # even the target of the batch the three make (1.75 x (10 + 3 x 2) = 28 ms).
    now = [0.0]

    def scheduler_with(urgent: int, low: int) -> tuple[Scheduler, PagedFakeModel, Sequence]:
        scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=256, itl_target=ItlTarget()), 256,
                              MAX_MODEL_LEN, eos_token_ids=[EOS], clock=lambda: now[0], step_cost=linear_cost())
        model = PagedFakeModel(256, 16)
        for i in range(2):
            scheduler.add_request(make_seq(f"u{i}", [2, 3, 4], max_tokens=6, priority=urgent))
        step(scheduler, model)
        long = make_seq("long", list(range(5, 405)), max_tokens=2, priority=low)
        scheduler.add_request(long)
        return scheduler, model, long

    def long_tokens(output) -> int:
        return sum(c.num_tokens for c in output.chunks if c.seq.request_id == "long")

    scheduler, model, long = scheduler_with(urgent=-10, low=10)
    output, _ = step(scheduler, model)
    assert long_tokens(output) == 10
    equal, equal_model, _ = scheduler_with(urgent=0, low=0)
    assert long_tokens(step(equal, equal_model)[0]) == 16
    # The urgent streams end; for priority_hold_s (2 s) another urgent request may come any moment, and would wait
    # for the step in flight: the prompt's steps stay within 1.75 x a one-row decode step (21 ms: 11 tokens) ...
    while any(seq.request_id.startswith("u") for seq in scheduler.running):
        step(scheduler, model)
    now[0] += 1.5
    assert long_tokens(step(scheduler, model)[0]) == 11
    # ... and once no urgent request has been seen for that long, the prompt takes the whole budget again.
    now[0] += 2.5
    output, _ = step(scheduler, model)
    assert long_tokens(output) == min(256, long.num_prompt_tokens - (long.num_computed_tokens - long_tokens(output)))
    assert output.num_batched_tokens == 256 or long.num_computed_tokens >= long.num_prompt_tokens


def test_a_waiting_urgent_request_preempts_a_lower_priority_one_for_room() -> None:
    scheduler = make_scheduler(num_pages=6, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                               enable_prefix_caching=False)
    model = PagedFakeModel(6, 4)
    batch = make_seq("batch", list(range(2, 18)), max_tokens=8, priority=5)  # 16 tokens: 4 of the 6 pages
    scheduler.add_request(batch)
    step(scheduler, model)
    urgent = make_seq("urgent", list(range(20, 32)), max_tokens=2, priority=-1)  # 12 tokens: 3 pages
    scheduler.add_request(urgent)
    output, _ = step(scheduler, model)
    assert output.preempted == [batch] and [c.seq for c in output.chunks] == [urgent]
    assert list(scheduler.waiting) == [batch]
    # One of equal priority waits instead.
    scheduler2 = make_scheduler(num_pages=6, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                                enable_prefix_caching=False)
    model = PagedFakeModel(6, 4)
    first = make_seq("first", list(range(2, 18)), max_tokens=8, priority=1)
    scheduler2.add_request(first)
    step(scheduler2, model)
    second = make_seq("second", list(range(20, 32)), max_tokens=2, priority=1)
    scheduler2.add_request(second)
    output, _ = step(scheduler2, model)
    assert output.preempted == [] and [c.seq for c in output.chunks] == [first]


def test_priority_must_be_a_32_bit_integer() -> None:
    SamplingParams(priority=-(2**31)).validate()
    for bad in (2**31, 1.5, True, "1"):
        with pytest.raises(InvalidParameterError) as caught:
            SamplingParams(priority=bad).validate()
        assert caught.value.param == "priority"


def test_greedy_outputs_with_mixed_priorities_match_each_prompt_alone() -> None:
    engine = tiny_engine(max_num_seqs=3, num_blocks=12)  # a small pool and batch: admission waits and preempts
    prompts = [[3 + (i * 11 + j) % 200 for j in range(20 + 9 * i)] for i in range(6)]
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, priority=p) for p in (3, -1, 0, 3, -2, 1)]

    def run(waves):
        """Add each wave of requests two steps after the one before; return each request's tokens."""
        done, tag = {}, len(sum(waves, []))
        for wave in waves:
            for i in wave:
                engine.add_request(f"p{i}-{tag}", prompts[i], params[i])
            for _ in range(2):
                done |= {out.request_id: out.output_token_ids for out in engine.step() if out.finished}
        while engine.has_unfinished():
            done |= {out.request_id: out.output_token_ids for out in engine.step() if out.finished}
        return done

    together = run([[0, 3, 5], [4, 1, 2]])  # the low priorities first, then the urgent ones preempt them
    assert engine.scheduler.num_preemptions > 0
    for i in range(6):
        alone = run([[i]])
        assert together[f"p{i}-6"] == alone[f"p{i}-1"], f"prompt {i}"


def test_the_server_takes_priority_and_refuses_a_bad_one() -> None:
    with serve_tiny_model(max_num_seqs=2) as server:
        for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})):
            ok = httpx.post(server.url + path, json=body | {"priority": -3}, timeout=60)
            assert ok.status_code == 200, ok.text
            for bad in (2**40, 1.5, "high", None):
                response = httpx.post(server.url + path, json=body | {"priority": bad}, timeout=60)
                assert response.status_code == 400, (bad, response.text)
                assert response.json()["error"]["param"] == "priority"


# A sustained stream of urgent requests, one arriving every step, and one low-priority request at step 0: with one
# sequence in the batch, strict priority admits the low one only once the stream stops; ageing bounds its wait.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(aging_steps=st.integers(1, 4), gap=st.integers(1, 4), urgent=st.integers(-3, 0),
       lengths=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 3)), min_size=40, max_size=40))
def test_ageing_bounds_how_long_a_low_priority_waits(aging_steps, gap, urgent, lengths) -> None:
    low = (0, 6, 2, urgent + gap)
    stream = [(step_index, prompt_len, max_tokens, urgent) for step_index, (prompt_len, max_tokens) in enumerate(lengths)]
    requests = [low, *stream]

    def first_admission(scheduler) -> list[Sequence]:
        admitted: list[Sequence] = []

        def record(before, output, after):
            admitted.extend(c.seq for c in output.chunks if c.seq not in admitted and c.seq in before[0])

        everyone = drive(scheduler, requests, record)
        assert_all_correct(scheduler, everyone)
        return admitted

    setup = dict(num_pages=64, block_size=4, max_num_batched_tokens=16, max_num_seqs=1, enable_prefix_caching=False)
    strict = first_admission(make_scheduler(**setup))
    assert strict[-1].request_id == "r0", "without ageing the stream starves the low priority to its end"

    aged = first_admission(make_scheduler(**setup, priority_aging_steps=aging_steps))
    position = [s.request_id for s in aged].index("r0")
    # After gap * aging_steps steps of waiting it queues at the stream's priority, ahead of later arrivals: nothing
    # that arrived after that is admitted before it.
    bound = gap * aging_steps
    overtaken_by = [int(s.request_id[1:]) - 1 for s in aged[:position]]  # stream index = arrival step
    assert all(arrival < bound for arrival in overtaken_by), (bound, overtaken_by)


def test_ageing_is_off_by_default_and_takes_only_a_positive_step_count() -> None:
    from ridgeline.engine.scheduler import SchedulerConfig
    from ridgeline.errors import RidgelineError

    assert SchedulerConfig().priority_aging_steps is None
    with pytest.raises(RidgelineError, match="priority_aging_steps must be at least 1"):
        SchedulerConfig(priority_aging_steps=0)
