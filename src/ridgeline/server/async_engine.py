"""Drives a synchronous `LLMEngine` from an asyncio server: the engine steps in its own thread, and each
step's outputs are handed to the waiting HTTP handlers through per-request asyncio queues, so a token
reaches its client as soon as the step that produced it ends.

The engine is not thread-safe, so the event loop never touches it: adds and aborts are queued as typed messages
(engine/messages.py) that the engine thread applies between steps. Requests arrive already admitted: the handler
ran the engine's admission check (pure, thread-safe) and answered a bad request with a 400 before queueing it.
"""

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ridgeline.cluster.kv_transfer.messages import TransferFailed
from ridgeline.cluster.kv_transfer.receiver import KVTransport, commit, fetch, reserve
from ridgeline.engine.kv_handoff import PageRef
from ridgeline.engine.messages import AbortRequest, AddRequest, EngineMessage, ReceiveKV
from ridgeline.errors import RidgelineError
from ridgeline.server.errors import APIError
from ridgeline.server.metrics import ServerMetrics


@dataclass(frozen=True)
class _KVArrived:
    """From a fetch thread: a ReceiveKV's pages are here."""

    request_id: str
    refs: list[PageRef]
    payloads: list[bytes]
    seconds: float


@dataclass(frozen=True)
class _KVFailed:
    request_id: str
    reason: str


class EngineDeadError(RuntimeError):
    """The engine thread failed; every request in flight fails with it and the server reports unhealthy."""


class Submission:
    """The engine requests behind one HTTP request (one per choice) and the queue their outputs arrive on."""

    def __init__(self, driver: "AsyncEngine", request_ids: list[str]):
        self._driver = driver
        self.request_ids = request_ids
        self.queue: asyncio.Queue = asyncio.Queue()
        self._unfinished = set(request_ids)

    async def outputs(self) -> AsyncIterator[tuple[int, object]]:
        """(choice index, RequestOutput) pairs in the order the engine produced them, until all choices finish."""
        while self._unfinished:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            index, output = item
            if output.finished:
                self._unfinished.discard(output.request_id)
            yield index, output

    def close(self) -> None:
        """Abort whatever has not finished (client gone, error, shutdown) so its KV blocks are freed at once."""
        self._driver._release(self, aborting=sorted(self._unfinished))
        self._unfinished.clear()


class AsyncEngine:
    def __init__(self, engine, metrics: ServerMetrics, max_num_seqs: int, max_waiting: int,
                 kv_transport: KVTransport | None = None, feed=None):
        self.engine = engine
        # Held around every engine call on the engine thread, and by anything else that must touch the engine (a
        # prefill worker's KV source reading held pages from its own thread).
        self.engine_lock = threading.Lock()
        self.kv_transport = kv_transport  # a decode worker's: how it pulls pages from prefill workers
        self._deferred: list[ReceiveKV] = []  # no pages free for them yet
        self.metrics = metrics
        self.feed = feed  # the dashboard's DashboardFeed: sees every step's outputs on this thread
        # Admission bound: at most max_num_seqs running plus max_waiting queued; past it, 503.
        self.capacity = max_num_seqs + max_waiting
        self.accepting = True
        self.error: BaseException | None = None
        self._routes: dict[str, tuple[Submission, int]] = {}  # request id -> its submission and choice index
        self._submissions: set[Submission] = set()
        self._inbox: list[EngineMessage | _KVArrived | _KVFailed] = []
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ event-loop side

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="ridgeline-engine", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    def submit(self, requests: list[AddRequest]) -> Submission:
        """Queue all choices of one HTTP request, or none: 503 when shutting down, dead, or over capacity."""
        if not self.accepting:
            raise APIError(503, "server is shutting down", code="shutting_down")
        if not self.healthy:
            raise APIError(503, f"engine is not running: {self.error!r}", code="engine_dead")
        if len(self._routes) + len(requests) > self.capacity:
            raise APIError(
                503,
                f"server is at capacity ({self.capacity} requests in flight); retry later",
                code="server_overloaded",
                headers={"Retry-After": "1"},
            )
        submission = Submission(self, [r.request_id for r in requests])
        for index, request in enumerate(requests):
            self._routes[request.request_id] = (submission, index)
        self._submissions.add(submission)
        self._send(requests)
        return submission

    def _release(self, submission: Submission, aborting: list[str]) -> None:
        for request_id in submission.request_ids:
            self._routes.pop(request_id, None)
        self._submissions.discard(submission)
        if aborting:
            self._send([AbortRequest(request_id) for request_id in aborting])

    async def shutdown(self, drain_timeout: float) -> None:
        """Stop accepting, let in-flight requests finish for up to drain_timeout seconds, abort the rest, stop."""
        self.accepting = False
        deadline = time.monotonic() + drain_timeout
        while self._submissions and time.monotonic() < deadline and self.healthy:
            await asyncio.sleep(0.05)
        for submission in list(self._submissions):
            submission.queue.put_nowait(APIError(503, "server shut down before the request finished"))
            submission.close()
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def _send(self, messages: list[EngineMessage]) -> None:
        with self._wake:
            self._inbox.extend(messages)
            self._wake.notify()

    def _deliver(self, outputs: list) -> None:
        for output in outputs:
            route = self._routes.get(output.request_id)
            if route is not None:  # None: its client is gone and the abort is on its way
                submission, index = route
                submission.queue.put_nowait((index, output))

    def _reject(self, request_id: str, error: Exception) -> None:
        route = self._routes.get(request_id)
        if route is not None:
            route[0].queue.put_nowait(error)

    def _fail_all(self, error: BaseException) -> None:
        for submission in list(self._submissions):
            submission.queue.put_nowait(error)

    # ------------------------------------------------------------ engine-thread side

    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._inbox and not self._stop and not self.engine.has_work():
                        if self._deferred:  # KV waiting for free pages: look again soon
                            self._wake.wait(0.01)
                            break
                        self._wake.wait()
                    messages, self._inbox = self._inbox, []
                    stopping = self._stop
                with self.engine_lock:
                    retry, self._deferred = self._deferred, []
                    for message in retry + messages:
                        self._apply(message)
                    if stopping:  # after the shutdown's aborts, so their pages are back in the pool
                        return
                    outputs = self.engine.step() if self.engine.has_work() else []
                    if self.feed is not None:  # the dashboard's view of the engine, taken under its lock
                        self.feed.observe(outputs)
                self.metrics.observe_engine(self.engine.stats())
                for output in outputs:
                    if output.finished:
                        self.metrics.observe_finished(output)
                if outputs:
                    self._loop.call_soon_threadsafe(self._deliver, outputs)
        except BaseException as error:  # noqa: BLE001 - any engine failure must reach the waiting clients
            self.error = error
            self._loop.call_soon_threadsafe(self._fail_all, EngineDeadError(f"engine failed: {error!r}"))
            raise

    def _apply(self, message: EngineMessage | _KVArrived | _KVFailed) -> None:
        if isinstance(message, AddRequest):
            try:
                self.engine.add_admitted(message.request_id, message.request, message.arrival_time, message.fork_of,
                                         message.hold_kv)
            except RidgelineError as error:  # the request is at fault, not the engine: fail it alone
                self._loop.call_soon_threadsafe(self._reject, message.request_id, error)
        elif isinstance(message, ReceiveKV):
            self._receive_kv(message)
        elif isinstance(message, _KVArrived):
            try:
                commit(self.engine, message.request_id, message.refs, message.payloads)
            except RidgelineError:
                return  # aborted while its pages were on their way: the abort freed them
            self.metrics.observe_kv_received(len(message.refs), sum(map(len, message.payloads)), message.seconds)
        elif isinstance(message, _KVFailed):
            self.engine.abort(message.request_id)
            self.metrics.kv_transfers_failed.inc()
            error = APIError(502, f"KV transfer failed: {message.reason}", code="kv_transfer_failed")
            self._loop.call_soon_threadsafe(self._reject, message.request_id, error)
        else:
            self.engine.abort(message.request_id)  # frees its pages now; its "abort" output comes from the next step

    def _receive_kv(self, message: ReceiveKV) -> None:
        """Reserve pages on the engine thread, fetch on a thread of its own (the engine keeps stepping), commit back
        here; no room yet: try again after the next step."""
        try:
            refs = reserve(self.engine, message.request_id, message.request, message.manifest, message.first_logprobs)
        except (TransferFailed, RidgelineError) as error:
            self._apply(_KVFailed(message.request_id, str(error)))
            return
        if refs is None:
            self._deferred.append(message)
            return
        layout = self.engine.kv_layout()

        def pull() -> None:
            started = time.monotonic()
            try:
                payloads = fetch(self.kv_transport, message.source_address, message.manifest, refs, layout)
            except TransferFailed as error:
                self._send([_KVFailed(message.request_id, error.reason)])
                return
            self._send([_KVArrived(message.request_id, refs, payloads, time.monotonic() - started)])

        if self.kv_transport is None:
            self._apply(_KVFailed(message.request_id, "this server is not a decode worker (no KV transport)"))
            return
        threading.Thread(target=pull, name=f"kv-fetch-{message.request_id}", daemon=True).start()
