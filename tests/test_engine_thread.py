"""The one engine-thread driver (engine/engine_thread.py) that the server and the router's workers both stand on:
outputs reach each request's own sink, refusals take all of a submission or none, and nothing in flight is left
waiting when a request, the engine or the driver ends."""

import queue
import time
from dataclasses import dataclass

import pytest

from server_helpers import tiny_engine

from ridgeline.engine.engine_thread import EngineDeadError, EngineRefused, EngineThread
from ridgeline.engine.messages import AddRequest
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.errors import RidgelineError

WAIT = 60  # seconds before a test calls a request lost


def add(engine, request_id: str, prompt: list[int], max_tokens: int = 4) -> AddRequest:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return AddRequest(request_id, engine.admission.admit(prompt, params), time.monotonic())


def drain(items: queue.Queue) -> list:
    """Everything one sink received, up to its last item (a finished output or an exception)."""
    received = []
    while True:
        item = items.get(timeout=WAIT)
        received.append(item)
        if isinstance(item, BaseException) or item.finished:
            return received


@pytest.fixture
def engine():
    return tiny_engine(max_num_seqs=4, num_blocks=64)


def test_each_request_streams_to_its_own_sink_same_tokens_as_the_engine_alone(engine):
    prompts = {"a": [5, 6, 7, 8], "b": [9, 10, 11]}
    expected = {}
    for request_id, prompt in prompts.items():  # the reference: the engine stepped by hand, one request at a time
        engine.add_admitted(request_id, add(engine, request_id, prompt, 6).request)
        while engine.has_unfinished():
            for output in engine.step():
                if output.finished:
                    expected[request_id] = output.output_token_ids
    driver = EngineThread(engine).start()
    sinks = {request_id: queue.Queue() for request_id in prompts}
    driver.submit([(add(engine, f"{r}-2", p, 6), sinks[r].put) for r, p in prompts.items()])
    for request_id, sink in sinks.items():
        outputs = drain(sink)
        assert all(o.request_id == f"{request_id}-2" for o in outputs)
        assert [t for o in outputs for t in o.new_token_ids] == outputs[-1].output_token_ids == expected[request_id]
    assert driver.in_flight == 0 and driver.backlog().received == 2
    driver.stop()


def test_abort_frees_pages_and_ends_the_stream_with_abort(engine):
    driver = EngineThread(engine).start()
    sink = queue.Queue()
    driver.submit([(add(engine, "long", [1, 2, 3], max_tokens=400), sink.put)])
    sink.get(timeout=WAIT)  # it is running
    driver.abort("long")
    outputs = drain(sink)
    assert outputs[-1].finish_reason == "abort"
    driver.stop()
    assert engine.scheduler.block_manager.num_free_pages == engine.scheduler.block_manager.num_pages


def test_capacity_refuses_a_whole_submission_and_a_reused_id_is_the_requests_fault(engine):
    driver = EngineThread(engine, capacity=2).start()
    first = queue.Queue()
    driver.submit([(add(engine, "one", [1, 2], max_tokens=400), first.put)])
    with pytest.raises(EngineRefused) as refused:  # two more would make three: neither goes in
        driver.submit([(add(engine, "two", [3]), print), (add(engine, "three", [4]), print)])
    assert refused.value.full and driver.in_flight == 1
    with pytest.raises(RidgelineError, match="already in flight"):
        driver.submit([(add(engine, "one", [5]), print)])
    driver.abort("one")
    assert drain(first)[-1].finish_reason == "abort"  # the first request's stream is untouched by the clash
    driver.stop()


def test_a_request_the_engine_refuses_fails_alone(engine):
    add_admitted = engine.add_admitted

    def refusing(request_id, *args):  # fault injection: the engine's own add refuses this one request
        if request_id == "bad":
            raise RidgelineError("refused by the engine")
        add_admitted(request_id, *args)

    engine.add_admitted = refusing
    driver = EngineThread(engine).start()
    good, bad = queue.Queue(), queue.Queue()
    driver.submit([(add(engine, "good", [1, 2]), good.put), (add(engine, "bad", [3]), bad.put)])
    error = bad.get(timeout=WAIT)
    assert isinstance(error, RidgelineError) and "refused by the engine" in str(error)
    assert drain(good)[-1].finished and driver.alive and driver.in_flight == 0
    driver.stop()


def test_kill_fails_every_request_in_flight_and_refuses_new_ones(engine):
    driver = EngineThread(engine).start()
    sinks = [queue.Queue() for _ in range(3)]
    driver.submit([(add(engine, f"r{i}", [1 + i, 2], max_tokens=400), s.put) for i, s in enumerate(sinks)])
    driver.kill("operator pulled the plug")
    for sink in sinks:
        last = drain(sink)[-1]
        assert isinstance(last, EngineDeadError) and "pulled the plug" in str(last)
    with pytest.raises(EngineRefused) as refused:
        driver.submit([(add(engine, "late", [1]), print)])
    assert not refused.value.full and "pulled the plug" in str(refused.value)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises, on purpose
def test_an_engine_that_raises_fails_its_requests_instead_of_hanging(engine):
    def broken_step():
        raise RuntimeError("kernel fault")

    engine.step = broken_step
    driver = EngineThread(engine).start()
    sink = queue.Queue()
    driver.submit([(add(engine, "r", [1, 2]), sink.put)])
    error = sink.get(timeout=WAIT)
    assert isinstance(error, EngineDeadError) and "kernel fault" in str(error)
    assert not driver.alive and "kernel fault" in driver.error
    driver.stop()  # joins the thread, so its re-raised error is reported within this test


def test_stop_applies_queued_aborts_then_fails_what_is_left(engine):
    driver = EngineThread(engine).start()
    running, left = queue.Queue(), queue.Queue()
    driver.submit([(add(engine, "a", [1, 2], max_tokens=400), running.put),
                   (add(engine, "b", [3, 4], max_tokens=400), left.put)])
    running.get(timeout=WAIT)
    driver.abort("a")
    driver.stop()
    assert isinstance(drain(left)[-1], EngineDeadError)
    assert "a" not in engine.scheduler._requests  # its abort was applied before the thread ended


@dataclass(frozen=True)
class Later:
    """A message kind the driver does not know: handled by a plug-in handler."""

    request_id: str


def test_a_handler_that_says_not_now_is_offered_the_message_again_after_a_step(engine):
    offered = []

    def handler(message: Later) -> bool:
        offered.append(message.request_id)
        return len(offered) >= 3  # no room the first two times

    driver = EngineThread(engine, handlers={Later: handler}).start()
    driver.send([Later("x")])
    deadline = time.monotonic() + WAIT
    while len(offered) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert offered == ["x", "x", "x"]  # retried while idle, and not again once it was taken
    driver.stop()


def test_an_abort_drops_the_requests_message_still_waiting_for_room(engine):
    offered = []

    def handler(message: Later) -> bool:
        offered.append(message.request_id)
        return False  # never room

    driver = EngineThread(engine, handlers={Later: handler}).start()
    driver.send([Later("x")])
    deadline = time.monotonic() + WAIT
    while not offered and time.monotonic() < deadline:
        time.sleep(0.01)
    driver.abort("x")
    time.sleep(0.1)
    count = len(offered)
    time.sleep(0.2)  # at 10 ms per retry, a message still deferred would be offered ~20 more times
    assert len(offered) == count, "the aborted request's message is still offered"
    driver.stop()


def test_backlog_counts_prompt_tokens_not_yet_computed(engine):
    driver = EngineThread(engine).start()
    with driver.engine_lock:  # the engine thread cannot apply anything meanwhile: both stay queued
        driver.submit([(add(engine, "a", list(range(1, 41))), print), (add(engine, "b", list(range(1, 11))), print)])
        backlog = driver.backlog()
    assert backlog.received == 2 and backlog.queued_prefill_tokens == 50
    deadline = time.monotonic() + WAIT
    while driver.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert driver.backlog().queued_prefill_tokens == 0
    driver.stop()


def test_detailed_backlog_names_each_request_and_leaves_out_its_cached_prefix(engine):
    from ridgeline.engine.engine_thread import _prefill_remaining

    driver = EngineThread(engine, detailed_backlog=True).start()
    shared = list(range(1, 65))  # four blocks of 16
    first: queue.Queue = queue.Queue()
    driver.submit([(add(engine, "first", shared + [70]), first.put)])
    drain(first)
    with driver.engine_lock:
        driver.submit([(add(engine, "queued", shared + [71, 72]), print)])
        assert driver.backlog().prefill_remaining["queued"] is None  # still in the inbox: not looked at
        # As the engine thread computes it after a step, for a prompt waiting with its prefix cached.
        engine.add_admitted("waiting", engine.admission.admit(shared + [73, 74, 75], SamplingParams(max_tokens=1)))
        assert _prefill_remaining(engine.scheduler)["waiting"] == 3
        engine.abort("waiting")
    driver.stop()


def test_detailed_backlog_leaves_out_a_prefix_a_request_ahead_is_computing(engine):
    """Two turns on one new prefix: the second waits while the first computes it, then finds it cached, so its
    backlog is its own turn only (the router takes this figure for its load count; the whole prompt made the
    replica holding the prefix look a prefill busier than it was, and the next turn went to the other replica)."""
    from ridgeline.engine.engine_thread import _prefill_remaining

    shared = list(range(1, 65))  # four blocks of 16, not in the cache yet
    params = SamplingParams(max_tokens=1)
    engine.add_admitted("first", engine.admission.admit(shared + [70], params))
    engine.add_admitted("second", engine.admission.admit(shared + [71, 72], params))
    engine.add_admitted("other", engine.admission.admit(list(range(101, 165)) + [73], params))
    # The first (ahead in the queue) computes the prefix itself; the second pays for its last two tokens only.
    assert _prefill_remaining(engine.scheduler) == {"first": 65, "second": 2, "other": 65}
    engine.step()  # the first computes it, the second waits for it (scheduler._prefix_in_flight), then hits it
    while engine.has_unfinished():
        engine.step()
    assert engine.scheduler.num_prefilled_tokens == 65 + 2 + 65  # what the backlog said each would cost
