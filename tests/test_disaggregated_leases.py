"""Nothing a disaggregated front accepted is lost (issue 41): each race between a prefill worker's lease on held KV
pages and the decode side that comes for them, made to happen on purpose rather than by luck.

Unit level, with a fake clock: a lease kept alive by a LeaseKeeper never lapses however long the wait, and lapses
once let go; pages not offered a lease after they finished are freed, and an offer then is PagesGone (a 503, never
a 400); a release that races a pull waits for the read, so pages are never freed mid-read and freed exactly once.

Server level, on the tiny model: a decode step that takes three leases (the decode engine held, as a long step
holds it) does not cost the request its pages; a decode worker restarted between prefill and pull gets the same
pages sent to its successor; a prefill worker restarted before the pull makes the front prefill again, once,
counted; and a decode worker whose KV queue is full makes the front refuse before it spends a prefill.
"""

import contextlib
import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest

from server_helpers import tiny_engine

from ridgeline.cluster.kv_transfer.inprocess import InProcessTransport
from ridgeline.cluster.kv_transfer.messages import LAYOUT_MISMATCH, Failed, KeepAlive, Pages, Pull, decode, encode
from ridgeline.cluster.kv_transfer.source import KVSource, PagesGone
from ridgeline.engine.kv_handoff import KVHandoffError, KVManifest, PageRef
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
from ridgeline.server.kv_leases import LeaseKeeper
from ridgeline.server.launcher import BackgroundServer

# ---------------------------------------------------------------------------------------------- unit level


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeEngine:
    """What a KV source asks of an engine; a page read can be held open (`slow_reads`) to race a release."""

    def __init__(self):
        self.scheduler = SimpleNamespace(held={})
        self.released: list[str] = []
        self.slow_reads = False
        self.reading, self.finish_read = threading.Event(), threading.Event()

    def kv_layout(self):
        return SimpleNamespace(digest=lambda: "layout")

    def finish(self, request_id: str) -> None:
        self.scheduler.held[request_id] = SimpleNamespace(finish_time=0.0)

    def offer_kv(self, request_id: str) -> KVManifest:
        if request_id not in self.scheduler.held:
            raise KVHandoffError(f"request {request_id!r} holds no KV here")
        return KVManifest(request_id, (1, 2, 3), 4, (PageRef(0, 0, None),), "layout", 0)

    def read_kv_pages(self, request_id: str, refs: list) -> list[bytes]:
        if self.slow_reads:
            self.reading.set()
            assert self.finish_read.wait(10)
        if request_id not in self.scheduler.held:
            raise KVHandoffError(f"request {request_id!r} holds no KV here (read after its release)")
        return [b"page" for _ in refs]

    def release_kv(self, request_id: str) -> bool:
        self.released.append(request_id)
        return self.scheduler.held.pop(request_id, None) is not None


class FakeEngineThread:
    """An EngineThread's attach points; messages sent to it are applied at once."""

    def __init__(self):
        self.observers, self.handlers = [], {}

    def send(self, messages: list) -> None:
        for message in messages:
            self.handlers[type(message)](message)


def attached_source(lease: float = 4.0) -> tuple[KVSource, FakeEngine, FakeClock]:
    engine, clock = FakeEngine(), FakeClock()
    source = KVSource(engine, lease_seconds=lease, clock=clock)
    source.attach(FakeEngineThread())
    return source, engine, clock


def finished(source: KVSource, engine: FakeEngine, request_id: str) -> None:
    """What the engine thread does as a held request finishes: its pages' manifest is prepared."""
    engine.finish(request_id)
    source.prepare(request_id, engine.offer_kv(request_id))


def test_a_kept_lease_never_lapses_and_a_let_go_one_does():
    source, engine, clock = attached_source(lease=4.0)
    transport = InProcessTransport()
    transport.serve("prefill-0", source)
    lost = []
    keeper = LeaseKeeper(transport, on_lost=lambda key, reason: lost.append(key), clock=clock, threaded=False)
    finished(source, engine, "r")
    source.offer("r")
    keeper.hold("decode-r", "prefill-0", "r", lease_seconds=4.0)  # a keep-alive every second
    for _ in range(400):  # 100 leases of waiting: a decode side whose steps take minutes
        clock.now += 0.5
        keeper.tick()
        assert source.expire() == []
    assert engine.released == [] and keeper.num_sent >= 199 and lost == []
    keeper.let_go("decode-r")
    clock.now += 4.0
    keeper.tick()
    assert source.expire() == ["r"] and engine.released == ["r"]


def test_a_keeper_reports_pages_gone_only_while_it_still_holds_them():
    source, engine, clock = attached_source(lease=4.0)
    transport = InProcessTransport()
    transport.serve("prefill-0", source)
    lost = []
    keeper = LeaseKeeper(transport, on_lost=lambda key, reason: lost.append((key, reason)), clock=clock,
                         threaded=False)
    for request_id in ("a", "b"):
        finished(source, engine, request_id)
        source.offer(request_id)
        keeper.hold(request_id, "prefill-0", request_id, lease_seconds=4.0)
    source.drop("a")  # pulled (or released) meanwhile
    clock.now += 1.0
    assert keeper.tick() == ["a"] and lost[0][0] == "a" and "no KV held" in lost[0][1]
    transport.close("prefill-0")  # the prefill worker is gone: every lease it held with it
    keeper.let_go("b")  # ... but "b" was let go first (its pull started): nothing to report
    clock.now += 1.0
    assert keeper.tick() == [] and len(lost) == 1


def test_pages_not_offered_within_a_lease_are_freed_and_a_late_offer_is_pages_gone_not_a_400():
    """The issue's 400: a prefill worker whose answer went out late found its held pages freed. Now the lease
    starts when the answer goes out (offer), and pages held a whole lease unoffered (the client left) are freed
    and offering them is PagesGone, which the server answers 503 kv_pages_gone."""
    source, engine, clock = attached_source(lease=4.0)
    finished(source, engine, "late")
    finished(source, engine, "slow")
    clock.now += 3.9  # the answer of "late" goes out late, inside a lease: its lease starts now
    source.offer("late")
    clock.now += 3.9
    assert source.expire() == [] and engine.released == ["slow"]  # "slow" never went out: freed a lease on
    with pytest.raises(PagesGone):
        source.offer("slow")
    reply, frames = source.handle(Pull("late", "layout", (PageRef(0, 0, None),)))
    assert isinstance(reply, Pages) and frames == [b"page"]


def test_a_release_racing_a_pull_waits_for_the_read_and_frees_the_pages_once():
    source, engine, clock = attached_source()
    finished(source, engine, "r")
    source.offer("r")
    engine.slow_reads = True
    replies = []
    pulling = threading.Thread(target=lambda: replies.append(source.handle(Pull("r", "layout", (PageRef(0, 0, None),)))))
    pulling.start()
    assert engine.reading.wait(10)  # the pull is reading the pages now
    releasing = threading.Thread(target=source.drop, args=("r",))  # a front's release (its client left)
    releasing.start()
    releasing.join(0.2)
    assert releasing.is_alive() and engine.released == []  # the release waits for the read
    engine.finish_read.set()
    pulling.join(10)
    releasing.join(10)
    assert isinstance(replies[0][0], Pages) and replies[0][1] == [b"page"]
    assert engine.released == ["r"]
    source.handle(Failed("r", "decode side gave up"))  # a late word about it changes nothing
    reply, _ = source.handle(KeepAlive("r"))
    assert isinstance(reply, Failed) and "no KV held" in reply.reason
    assert engine.released == ["r"]


def test_a_failed_reply_says_whether_prefilling_again_can_help():
    assert decode(encode(Failed("r", "lease lapsed"))).error().retriable
    mismatch = decode(encode(Failed("r", "layouts differ", LAYOUT_MISMATCH)))
    assert mismatch.code == LAYOUT_MISMATCH and not mismatch.error().retriable


# ---------------------------------------------------------------------------------------------- server level

PROMPT = "The quick brown fox jumps over the lazy dog " * 3


def serve(role: str = "both", engine=None, drain_timeout: float = 5.0, **options) -> BackgroundServer:
    return BackgroundServer(create_app(engine or tiny_engine(), ServerConfig(role=role, **options)),
                            drain_timeout=drain_timeout)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith((name + "{", name + " ")))


def kv_waiting(decode_url: str) -> int:
    return httpx.post(f"{decode_url}/v1/kv/lookup", json={"prompt": PROMPT}).json()["kv_waiting"]


def wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.02)


class MovingPool:
    """Workers whose URLs change when one restarts (as on Ray): refresh() finds the current ones."""

    def __init__(self, prefill: list[str], decode: list[str]):
        self.current = {"prefill": prefill, "decode": decode}
        self._urls = {role: list(urls) for role, urls in self.current.items()}

    def urls(self, role: str) -> list[str]:
        return self._urls[role]

    def refresh(self) -> None:
        self._urls = {role: list(urls) for role, urls in self.current.items()}


def without_room(engine):
    """The decode engine says "no room" to remote KV until the returned event is set (a decode worker full of
    long prompts)."""
    room = threading.Event()
    reserve = engine.scheduler.reserve_prefilled
    engine.scheduler.reserve_prefilled = lambda seq: room.is_set() and reserve(seq)
    return room


def ask(url: str) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        try:
            response = api.completions.with_raw_response.create(
                model=api.models.list().data[0].id, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
            outcome["reprefills"] = int(response.headers.get("x-ridgeline-reprefills", 0))
            outcome["answer"] = response.parse().choices[0].text
        except openai.APIError as error:
            outcome["error"] = error

    asking = threading.Thread(target=run)
    asking.start()
    return asking, outcome


@pytest.fixture(scope="module")
def expected() -> str:
    with serve() as colocated:
        api = openai.OpenAI(base_url=f"{colocated.url}/v1", api_key="unused", max_retries=0)
        return api.completions.create(model=api.models.list().data[0].id, prompt=PROMPT, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text


def front(prefill: str | list[str], decode: str | list[str], pool=None) -> BackgroundServer:
    as_tuple = lambda urls: (urls,) if isinstance(urls, str) else tuple(urls)  # noqa: E731
    return BackgroundServer(create_front_app(FrontConfig(as_tuple(prefill), as_tuple(decode), local_prefill_tokens=1),
                                             pool))


def test_a_decode_step_three_leases_long_does_not_cost_the_request_its_pages(expected):
    """The decode worker's engine is held (as a long step holds it) from before the request reaches it until three
    of the prefill worker's 1 s leases have passed: the request cannot even be looked at there. Its lease is kept
    alive from the moment the decode worker took it, off the engine, so it is answered as colocated, with no
    re-prefill and no failed transfer."""
    engine = tiny_engine()
    with serve("prefill", kv_lease_seconds=1.0) as prefill, serve("decode", engine=engine) as decode:
        driver = decode.server.config.app.state.serving.engine
        with front(prefill.url, decode.url) as proxy:
            with driver.engine_lock:  # a decode step that does not end
                asking, outcome = ask(proxy.url)
                wait_for(lambda: kv_waiting(decode.url) == 1)  # taken, and stuck behind the step
                time.sleep(3.0)
                assert metric(prefill.url, "ridgeline_kv_held_requests") == 1, "the lease lapsed"
            asking.join(30)
            assert outcome.get("answer") == expected, outcome.get("error")
            assert outcome["reprefills"] == 0 and metric(proxy.url, "ridgeline_front_reprefills_total") == 0
        assert metric(decode.url, "ridgeline_kv_transfers_failed_total") == 0
        assert metric(prefill.url, "ridgeline_kv_held_requests") == 0


def test_a_decode_worker_restarted_between_prefill_and_pull_gets_the_same_pages_sent_to_its_successor(expected):
    """The decode worker took the prefilled request and waits for room when it goes away (restarted: its
    successor is at another address, as on Ray). The front keeps the pages' lease alive meanwhile and hands the
    same pages to the successor: answered as colocated, without prefilling again."""
    first_engine = tiny_engine()
    room = without_room(first_engine)
    with serve("prefill", kv_lease_seconds=1.0) as prefill, serve("decode") as successor:
        with contextlib.ExitStack() as first_alive:
            first = first_alive.enter_context(serve("decode", engine=first_engine, drain_timeout=0.3))
            pool = MovingPool([prefill.url], [first.url])
            with front(prefill.url, first.url, pool) as proxy:
                asking, outcome = ask(proxy.url)
                wait_for(lambda: kv_waiting(first.url) == 1)
                time.sleep(1.5)  # longer than the lease
                pool.current["decode"] = [successor.url]
                first_alive.close()  # goes away with the request taken and not pulled
                asking.join(30)
                assert outcome.get("answer") == expected, outcome.get("error")
                assert outcome["reprefills"] == 0 and metric(proxy.url, "ridgeline_front_reprefills_total") == 0
                assert metric(proxy.url, 'ridgeline_front_prefills_total{placement="remote"}') == 1
        assert not room.is_set()
        assert metric(successor.url, "ridgeline_kv_transfer_pages_received_total") > 0
        assert metric(prefill.url, "ridgeline_kv_held_requests") == 0


def test_a_prefill_worker_restarted_before_the_pull_makes_the_front_prefill_again_once(expected):
    """The decode worker took the request and waits for room when the prefill worker holding its pages goes away
    (restarted elsewhere). The decode worker's next keep-alive finds it gone and answers 503 kv_pages_gone at once;
    the front prefills again on the restarted worker and the answer is the colocated one, one re-prefill counted
    (in /metrics and in the response's header), nothing left held anywhere."""
    decode_engine = tiny_engine()
    room = without_room(decode_engine)
    with serve("decode", engine=decode_engine) as decode, serve("prefill") as restarted:
        with contextlib.ExitStack() as first_alive:
            first = first_alive.enter_context(serve("prefill", kv_lease_seconds=1.0))
            pool = MovingPool([first.url], [decode.url])
            with front(first.url, decode.url, pool) as proxy:
                asking, outcome = ask(proxy.url)
                wait_for(lambda: kv_waiting(decode.url) == 1)
                pool.current["prefill"] = [restarted.url]
                first_alive.close()
                wait_for(lambda: metric(proxy.url, "ridgeline_front_reprefills_total") == 1)
                wait_for(lambda: kv_waiting(decode.url) == 1)  # the second prefill's pages, waiting for room
                room.set()
                asking.join(30)
                assert outcome.get("answer") == expected, outcome.get("error")
                assert outcome["reprefills"] == 1
                assert metric(proxy.url, "ridgeline_front_refusals_total") == 0
        assert metric(decode.url, "ridgeline_kv_transfers_failed_total") == 1
        assert metric(restarted.url, "ridgeline_kv_held_requests") == 0
        assert metric(decode.url, "ridgeline_kv_cache_free_pages") == metric(decode.url, "ridgeline_kv_cache_total_pages")


def test_a_full_decode_queue_is_refused_before_any_prefill_is_spent(expected):
    """A decode worker that takes at most one request waiting for KV room, and has one: the front refuses the next
    with 503 and Retry-After before prefilling it (one remote prefill in all), counts the refusal, and the first is
    answered once room comes."""
    decode_engine = tiny_engine()
    room = without_room(decode_engine)
    with serve("decode", engine=decode_engine, max_kv_waiting=1) as decode, serve("prefill") as prefill:
        with front(prefill.url, decode.url) as proxy:
            asking, outcome = ask(proxy.url)
            wait_for(lambda: kv_waiting(decode.url) == 1)
            refused = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 8})
            assert refused.status_code == 503 and refused.headers["retry-after"]
            assert refused.json()["error"]["code"] == "decode_busy"
            assert metric(proxy.url, 'ridgeline_front_prefills_total{placement="remote"}') == 1
            assert metric(proxy.url, "ridgeline_front_refusals_total") == 1
            room.set()
            asking.join(30)
            assert outcome.get("answer") == expected, outcome.get("error")


def test_a_prefilled_request_the_decode_worker_has_no_room_for_yet_waits_at_the_front(expected):
    """The decode worker's queue filled while a request was being prefilled (its lookup said it took more; here
    the lookup is skipped to make that so). The prefill is spent: the front keeps the pages' lease alive and
    offers the request again until the queue has room, within its handoff wait, instead of refusing it."""
    decode_engine = tiny_engine()
    room = without_room(decode_engine)
    with serve("decode", engine=decode_engine, max_kv_waiting=1) as decode, \
            serve("prefill", kv_lease_seconds=1.0) as prefill, front(prefill.url, decode.url) as proxy:
        first, first_outcome = ask(proxy.url)
        wait_for(lambda: kv_waiting(decode.url) == 1)

        async def remote(*_):
            return "remote"

        proxy.server.config.app.state.front._where_to_prefill = remote  # a lookup from before the queue filled
        second, second_outcome = ask(proxy.url)
        wait_for(lambda: metric(prefill.url, "ridgeline_kv_held_requests") == 2)  # prefilled, refused for now
        time.sleep(1.5)  # longer than the lease: the front keeps it
        room.set()
        for asking, outcome in ((first, first_outcome), (second, second_outcome)):
            asking.join(30)
            assert outcome.get("answer") == expected, outcome.get("error")
        assert metric(proxy.url, "ridgeline_front_refusals_total") == 0
        assert metric(proxy.url, "ridgeline_front_handoff_waits_total") == 1
        assert metric(prefill.url, "ridgeline_kv_held_requests") == 0


def test_serve_on_ray_gives_the_front_and_its_workers_one_handoff_config(monkeypatch):
    """`ridgeline serve --prefill-workers N --decode-workers M` takes the proxy's hand-off options and the decode
    worker's KV queue bound, and hands them, as one HandoffConfig, to the front it runs and to the pool that starts
    its workers (each decode worker reads its bound from there: tests/test_disaggregated_ray.py). Ray itself is not
    started here: the pool and the HTTP server are stand-ins."""
    import uvicorn
    from typer.testing import CliRunner

    from ridgeline.cli import app, register_commands
    from ridgeline.cluster import ray_pool
    from ridgeline.cluster.handoff import HandoffConfig

    seen = {}

    class Pool:
        def __init__(self, config, start, address=None):
            seen["pool"] = config

        def urls(self, role: str) -> list[str]:
            return [f"http://{role}.invalid"]

        def refresh(self) -> None:
            pass

        def shutdown(self) -> None:
            seen["shut down"] = True

    monkeypatch.setattr(ray_pool, "RayWorkerPool", Pool)
    monkeypatch.setattr(uvicorn, "run", lambda served, **_: seen.setdefault("front", served.state.front))
    register_commands(["serve"])
    result = CliRunner().invoke(app, ["serve", "--prefill-workers", "1", "--decode-workers", "2", "--max-reprefills",
                                      "5", "--handoff-wait", "3.5", "--max-kv-waiting", "7", "--local-prefill-tokens",
                                      "9", "--kv-cache-memory", "64MiB", "--decode-kv-cache-memory", "24MiB"])
    assert result.exit_code == 0, result.output
    assert seen["pool"].handoff == HandoffConfig(local_prefill_tokens=9, max_reprefills=5, handoff_wait=3.5,
                                                 max_kv_waiting=7)
    config = seen["front"].config
    assert (config.max_reprefills, config.handoff_wait, config.local_prefill_tokens) == (5, 3.5, 9)
    assert seen["pool"].decode_workers == 2 and seen["shut down"]
    # Each role its own KV budget (the decode side's is what its backpressure is measured against).
    assert (seen["pool"].kv_cache_memory_for("prefill"), seen["pool"].kv_cache_memory_for("decode")) == ("64MiB", "24MiB")


def test_decode_kv_cache_memory_is_refused_where_no_ray_decode_worker_takes_it_or_unreadable():
    """`--decode-kv-cache-memory` sizes Ray decode workers only (a `--role decode` server is sized by
    --kv-cache-memory), and a size that cannot be read is one line before Ray starts, not an actor's traceback."""
    from typer.testing import CliRunner

    from ridgeline.cli import app, register_commands
    from ridgeline.cluster.ray_pool import PoolConfig
    from ridgeline.errors import RidgelineError

    register_commands(["serve"])
    for args, reason in ((["--role", "decode", "--decode-kv-cache-memory", "1GiB"], "a --role decode server takes"),
                         (["--prefill-workers", "1", "--decode-workers", "1", "--decode-kv-cache-memory", "lots"],
                          "cannot read 'lots' as a size")):
        result = CliRunner().invoke(app, ["serve", *args])
        assert isinstance(result.exception, RidgelineError) and reason in str(result.exception), result.output
    assert PoolConfig(kv_cache_memory="1GiB").kv_cache_memory_for("decode") == "1GiB"  # unset: one budget, as before
