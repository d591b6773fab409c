"""The one-model server's side of its engine thread (engine/engine_thread.py): submissions from the asyncio event
loop, each step's outputs handed back to the waiting HTTP handlers through per-request asyncio queues, so a token
reaches its client as soon as the step that produced it ends.

Requests arrive already admitted: the handler ran the engine's admission check (pure, thread-safe) and answered a
bad request with a 400 before queueing it. What is left here is HTTP's: 503s for a server that is shutting down,
dead or full, the drain on shutdown, and the server's metrics and dashboard feed, observed after every step.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ridgeline.cluster.kv_transfer.receiver import KVTransport
from ridgeline.engine.engine_thread import Delivery, EngineDeadError, EngineRefused, EngineThread, run_sinks
from ridgeline.engine.outputs import EngineStats
from ridgeline.engine.messages import AbortRequest, AddRequest, ReceiveKV
from ridgeline.server.errors import APIError
from ridgeline.server.kv_intake import MAX_KV_WAITING, KVIntake
from ridgeline.server.metrics import ServerMetrics

__all__ = ["AsyncEngine", "EngineDeadError", "EngineFront", "Submission"]


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state as its last step (or last off-thread change) left it, for readers on the event loop."""

    stats: EngineStats
    num_held: int  # requests whose pages wait for a decode worker to collect them (a prefill worker's)
    time: float  # time.monotonic() when it was taken


class PublishingLock:
    """engine_lock that publishes a new snapshot on release (reusable: `with lock:` any number of times)."""

    def __init__(self, driver: "AsyncEngine"):
        self._driver = driver

    def __enter__(self) -> None:
        self._driver.engine_lock.acquire()

    def __exit__(self, *_) -> None:
        try:
            self._driver.publish()
        finally:
            self._driver.engine_lock.release()


class Submission:
    """The engine requests behind one HTTP request (one per choice) and the queue their outputs arrive on."""

    def __init__(self, driver: "EngineFront", request_ids: list[str]):
        self._driver = driver
        self.request_ids = request_ids
        self.queue: asyncio.Queue = asyncio.Queue()
        self._unfinished = set(request_ids)
        self._first: list = []  # what ready() took from the queue, for outputs() to yield first
        self.left = False  # closed because the client left or its deadline passed
        self._seen: set[str] = set()  # requests an output arrived for
        # Called (on the event loop) with each request id that still finished, not aborted, after the client left:
        # a prefill worker frees the pages it would have held for a decode worker nobody will send.
        self.on_finished_after_leaving = None

    def arrive(self, index: int, item) -> None:
        """An output (or exception) from the engine, on the event loop."""
        if isinstance(item, BaseException):
            self.queue.put_nowait(item)
            return
        first = item.request_id not in self._seen
        self._seen.add(item.request_id)
        if self.left and self._driver is not None:
            if first and item.output_token_ids:  # its prefill completed, for nobody
                self._driver.metrics.prefills_for_gone_clients.inc()
            if item.finished and item.finish_reason != "abort" and self.on_finished_after_leaving is not None:
                self.on_finished_after_leaving(item.request_id)
        self.queue.put_nowait((index, item))

    async def ready(self) -> None:
        """Wait for the first output (raising what came instead): a decode worker's stream of remote KV starts
        once its pages are here, so a failed transfer is still an HTTP status, before the first byte."""
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        self._first.append(item)

    async def outputs(self) -> AsyncIterator[tuple[int, object]]:
        """(choice index, RequestOutput) pairs in the order the engine produced them, until all choices finish."""
        while self._unfinished:
            item = self._first.pop() if self._first else await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            index, output = item
            if output.finished:
                self._unfinished.discard(output.request_id)
            yield index, output

    def close(self, why: str | None = None) -> None:
        """Abort whatever has not finished (client gone, error, shutdown) so its KV blocks are freed at once.
        `why` "client_left" or "deadline": nobody waits for the answer any more; counted, and outputs arriving
        later are watched for prefills done for nobody."""
        if why is not None and not self.left:
            self.left = True
            if self._unfinished and self._driver is not None:
                metrics = self._driver.metrics
                (metrics.requests_deadline_exceeded if why == "deadline" else metrics.requests_client_left).inc()
        self._driver._release(self, aborting=sorted(self._unfinished))
        self._unfinished.clear()


class EngineFront:
    """What every driver of an engine shares on the event loop: the admission bound and its 503s, the submissions
    in flight and their drain on shutdown, and one hop per step from the driver's thread to the loop.

    `self.driver` is anything with EngineThread's submitting interface (start, alive, error, capacity,
    submit(routed), send(messages), stop()): the engine thread in this process (AsyncEngine), or the client of an
    engine core in a process of its own (server/engine_core/client.py)."""

    driver: object
    kv_intake: KVIntake
    snapshot: "EngineSnapshot"

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self.accepting = True
        self._submissions: set[Submission] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.driver.start()

    @property
    def healthy(self) -> bool:
        return self.driver.alive

    @property
    def error(self) -> str | None:
        return self.driver.error

    @property
    def num_submissions(self) -> int:
        return len(self._submissions)

    def submit(self, requests: list[AddRequest | ReceiveKV]) -> Submission:
        """Queue all choices of one HTTP request, or none: 503 when shutting down, dead, or over capacity."""
        if not self.accepting:
            raise APIError(503, "server is shutting down", code="shutting_down", headers={"Retry-After": "1"})
        submission = Submission(self, [r.request_id for r in requests])
        routed = [(request, lambda item, i=index: submission.arrive(i, item)) for index, request in enumerate(requests)]
        self.kv_intake.accept(requests)  # a decode worker's: its leases kept alive from now (or a 503 if full)
        try:
            self.driver.submit(routed)
        except BaseException as refused:
            self.kv_intake.withdraw(requests)
            if not isinstance(refused, EngineRefused):
                raise
            if refused.full:
                raise APIError(503, f"server is at capacity ({self.driver.capacity} requests in flight); retry later",
                               code="server_overloaded", headers={"Retry-After": "1"}) from None
            raise APIError(503, f"engine is not running: {self.error or 'stopped'}", code="engine_dead",
                           headers={"Retry-After": "1"}) from None
        self._submissions.add(submission)
        return submission

    def _release(self, submission: Submission, aborting: list[str]) -> None:
        self._submissions.discard(submission)
        if aborting:
            self.driver.send([AbortRequest(request_id) for request_id in aborting])

    async def drain(self, drain_timeout: float) -> None:
        """Stop accepting (503 shutting_down), let in-flight requests finish for up to drain_timeout seconds, then
        answer the rest with that 503 (an error event in a stream that started) and abort them."""
        self.accepting = False
        deadline = time.monotonic() + drain_timeout
        while self._submissions and time.monotonic() < deadline and self.healthy:
            await asyncio.sleep(0.05)
        for submission in list(self._submissions):
            submission.queue.put_nowait(APIError(503, "server shut down before the request finished",
                                                 code="shutting_down", headers={"Retry-After": "1"}))
            submission.close()

    async def shutdown(self, drain_timeout: float) -> None:
        """drain(), then stop the driver (the engine thread, or the engine core's process)."""
        await self.drain(drain_timeout)
        await asyncio.to_thread(self.driver.stop)
        self.kv_intake.close()

    def _deliver_soon(self, deliveries: list[Delivery]) -> None:
        """From the driver's thread: one hop to the event loop per step, where the queues live."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(run_sinks, deliveries)

    def observe_step(self, outputs: list, snapshot: "EngineSnapshot") -> None:
        """After every step, on the driver's thread: the gauges from the step's snapshot, the finished requests'
        counters."""
        self.snapshot = snapshot
        self.metrics.observe_engine(snapshot.stats)
        self.metrics.kv_held_requests.set(snapshot.num_held)
        for output in outputs:
            if output.finished:
                self.metrics.observe_finished(output)


class AsyncEngine(EngineFront):
    """The engine stepped by a thread of this process (engine/engine_thread.py)."""

    def __init__(self, engine, metrics: ServerMetrics, max_num_seqs: int, max_waiting: int,
                 kv_transport: KVTransport | None = None, feed=None, max_kv_waiting: int = MAX_KV_WAITING):
        super().__init__(metrics)
        self.engine = engine
        self.feed = feed  # the dashboard's DashboardFeed: sees every step's outputs on the engine thread
        # Admission bound: at most max_num_seqs running plus max_waiting queued; past it, 503.
        self.driver = self.thread = EngineThread(engine, "ridgeline-engine", capacity=max_num_seqs + max_waiting,
                                                 deliver=self._deliver_soon, observers=[self._observe])
        # Held around every engine call on the engine thread, and by anything else that must touch the engine (a
        # prefill worker's KV source reading held pages from its own thread).
        self.engine_lock = self.thread.engine_lock
        self.kv_intake = KVIntake(kv_transport, metrics, max_kv_waiting)  # a decode worker's ReceiveKV
        self.kv_intake.install(self.thread)
        # What /metrics (and anything else on the event loop) reads: swapped whole by publish(), never the engine
        # itself, so a scrape never waits for the lock a long step holds.
        self.snapshot = self._take_snapshot()

    # ------------------------------------------------------------ engine-thread side (or engine_lock held)

    def engine_access(self) -> "PublishingLock":
        """A lock for holding the engine off the engine thread (a prefill worker's KV source freeing pages): it is
        engine_lock, and it publishes what the holder changed before letting go, so the next scrape counts those
        pages at once."""
        return PublishingLock(self)

    def publish(self) -> None:
        """Take a new snapshot of the engine and set the engine gauges from it. Only with engine_lock held: after
        every step on the engine thread, and by engine_access()."""
        self.observe_step([], self._take_snapshot())

    def _take_snapshot(self) -> EngineSnapshot:
        return take_snapshot(self.engine)

    def _observe(self, outputs: list) -> None:
        if self.feed is not None:  # the dashboard's view of the engine, taken under its lock
            self.feed.observe(outputs)
        self.observe_step(outputs, self._take_snapshot())


def take_snapshot(engine) -> EngineSnapshot:
    """Only on the thread that steps `engine` (or with its lock held)."""
    return EngineSnapshot(engine.stats(), len(engine.scheduler.held), time.monotonic())
