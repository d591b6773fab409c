"""The API process's side of an engine core in its own process: a driver with the engine thread's interface
(start, alive, error, capacity, submit, send, stop), so EngineFront (server/async_engine.py) serves over it
exactly as over the thread: the same Submissions, 503s, drain and per-step hop to the event loop.

Outputs and snapshots come in on a receiver thread, which also watches the core's process: when it dies, every
request in flight ends at once with a 503 `engine_dead` (an error event in a stream that started), the core is
started again, and requests are taken again once it is ready (meanwhile: 503 `engine_dead`, /health 503). A core
that keeps dying (MAX_RESTARTS within RESTART_WINDOW) or cannot start ends the server with the usual graceful
shutdown (SIGTERM to itself), for its supervisor to restart whole, rather than a server that answers 503 forever.
"""

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import zmq

from ridgeline.engine.engine_thread import Delivery, EngineRefused, Sink
from ridgeline.engine.messages import AbortRequest, AddRequest
from ridgeline.errors import RidgelineError
from ridgeline.server.async_engine import EngineFront, EngineSnapshot
from ridgeline.server.engine_core.messages import (Abort, EngineDead, Shutdown, StatsSnapshot, StepOutputs, Submit,
                                                   decode, encode)
from ridgeline.server.engine_core.process import CoreProcess
from ridgeline.server.errors import APIError
from ridgeline.server.kv_intake import KVIntake
from ridgeline.server.metrics import ServerMetrics

log = logging.getLogger("ridgeline.engine_core")

MAX_RESTARTS = 3  # within RESTART_WINDOW seconds; one more death and the server shuts down
RESTART_WINDOW = 300.0


def core_died(reason: str) -> APIError:
    return APIError(503, f"the engine core died ({reason}); it is being restarted, retry shortly", code="engine_dead",
                    headers={"Retry-After": "1"})


class CoreClient:
    """Submissions to and outputs from the core, keyed by request id; `deliver` gets each message's outputs."""

    def __init__(self, core: CoreProcess, capacity: int, deliver: Callable[[list[Delivery]], None],
                 on_snapshot: Callable[[list, StatsSnapshot], None], give_up: Callable[[], None] | None = None):
        self.core = core
        self.capacity = capacity
        self._deliver = deliver
        self._on_snapshot = on_snapshot
        self._give_up = give_up or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self._lock = threading.Lock()  # guards the sinks, the state and the push socket
        self._sinks: dict[str, Sink] = {}
        self._stopping = False
        self.error: str | None = None  # set while the core is down (restarting) or for good
        self.restarts: list[float] = []  # when each restart began (the restart budget's window)
        self._wake_r, self._wake_w = os.pipe()  # stop() wakes the receiver's poll through this
        core.wake_fd = self._wake_r  # and a wait for a restarted core that another process starts (AttachedCore)
        self._thread = threading.Thread(target=self._receive, name="ridgeline-core-client", daemon=True)

    # ------------------------------------------------------------ the engine thread's interface, any thread

    def start(self) -> "CoreClient":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self.error is None and not self._stopping and self.core.alive

    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    def submit(self, routed: list[tuple[AddRequest, Sink]]) -> None:
        """All or none, as EngineThread.submit: EngineRefused when down or full, RidgelineError for an id in flight."""
        with self._lock:
            if not self.alive:
                raise EngineRefused(f"engine core is not running ({self.error or 'stopped'})", full=False)
            if len(self._sinks) + len(routed) > self.capacity:
                raise EngineRefused(f"at capacity ({self.capacity} requests in flight)", full=True)
            ids = [message.request_id for message, _ in routed]
            clash = next((i for n, i in enumerate(ids) if i in self._sinks or i in ids[:n]), None)
            if clash is not None:
                raise RidgelineError(f"request id {clash!r} is already in flight")
            for message, sink in routed:
                if not isinstance(message, AddRequest):  # a decode worker's ReceiveKV: refused at the CLI already
                    raise RidgelineError(f"the engine core process takes no {type(message).__name__}")
            for message, sink in routed:
                self._sinks[message.request_id] = sink
            self.core.send(encode(Submit(tuple(message for message, _ in routed))))

    def send(self, messages: list[object]) -> None:
        ids = tuple(m.request_id for m in messages if isinstance(m, AbortRequest))
        if len(ids) != len(messages):
            raise TypeError("the engine core client sends only aborts this way")
        with self._lock:
            if self.error is None and not self._stopping and self.core.push is not None:
                self.core.send(encode(Abort(ids)))

    def stop(self) -> None:
        """Shut the core down in order (what was queued is applied), then fail whatever is still in flight."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            # A core shared by several API processes is their supervisor's to stop, once they have all drained.
            if self.core.owns_core and self.core.alive and self.core.push is not None:
                self.core.send(encode(Shutdown()))
        os.write(self._wake_w, b"x")
        self.core.join()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)
        self._fail_all(APIError(503, "server shut down before the request finished", code="shutting_down",
                                headers={"Retry-After": "1"}))
        self.core.close()

    def kill(self, reason: str = "killed") -> None:
        """For tests and faults: the core is killed as a crash would (the receiver restarts it)."""
        self.core.kill()

    # ------------------------------------------------------------ receiver thread

    def _receive(self) -> None:
        while not self._stopping:
            poller = zmq.Poller()
            poller.register(self.core.pull, zmq.POLLIN)
            poller.register(self.core.sentinel, zmq.POLLIN)
            poller.register(self._wake_r, zmq.POLLIN)
            dead = None
            while dead is None and not self._stopping:
                events = dict(poller.poll())
                if self.core.pull in events:
                    dead = self._drain()
                elif self.core.sentinel in events:
                    dead = self._drain() or self.core.ended()
            if self._stopping or not self._restart(dead):
                return

    def _drain(self) -> str | None:
        """Handle every message waiting; the reason if one said the engine died."""
        while True:
            try:
                frame = self.core.pull.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            message = decode(frame.buffer)
            if isinstance(message, EngineDead):
                return message.reason
            if isinstance(message, StepOutputs):
                self._arrived(message)

    def _arrived(self, message: StepOutputs) -> None:
        deliveries, outputs = [], []
        with self._lock:
            for request_id, item in message.deliveries:
                sink = self._sinks.get(request_id)
                if sink is None:  # failed here already (the core died and came back; a late abort)
                    continue
                if isinstance(item, BaseException):
                    del self._sinks[request_id]
                else:
                    outputs.append(item)
                    if item.finished:
                        del self._sinks[request_id]
                deliveries.append((sink, item))
        if message.snapshot is not None:
            self._on_snapshot(outputs, message.snapshot)
        if deliveries:
            self._deliver(deliveries)

    def _restart(self, reason: str) -> bool:
        """Fail what was in flight, then start a new core; False if it gave up (the server is then shut down)."""
        log.error("engine core (pid %s) died: %s", self.core.pid, reason)
        with self._lock:
            self.error = reason
        self._fail_all(core_died(reason))
        self.core.kill()
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW] + [now]
        if len(self.restarts) > MAX_RESTARTS:
            return self._giving_up(f"the engine core died {len(self.restarts)} times in {RESTART_WINDOW:.0f} s")
        try:
            ready = self.core.start()
        except RidgelineError as error:
            if self._stopping:  # stop() ended the wait for the next core: nothing to give up on
                return False
            return self._giving_up(f"the engine core could not be restarted: {error}")
        log.info("engine core restarted (pid %d)", ready.pid)
        with self._lock:
            self.error = None
        return True

    def _giving_up(self, why: str) -> bool:
        log.error("%s: shutting the server down", why)
        with self._lock:
            self.error = why  # for good: /health and every request say so until the server has stopped
        self._give_up()
        return False

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            sinks, self._sinks = self._sinks, {}
        if sinks:
            self._deliver([(sink, error) for sink in sinks.values()])


class ProcessEngine(EngineFront):
    """EngineFront over an engine core in its own process (already started: `core.ready` is set)."""

    def __init__(self, core: CoreProcess, metrics: ServerMetrics, max_num_seqs: int, max_waiting: int, feed=None,
                 api_servers: int = 1):
        super().__init__(metrics)
        self.core = core
        self.feed = feed
        self.kv_intake = KVIntake(None, metrics)  # no ReceiveKV here: the P/D roles are refused with this core
        # The core's engine queues whatever it is sent: the bound on requests in flight is kept here, so with
        # several API processes each takes its share (rounded up), and together they never send much more.
        capacity = -(-(max_num_seqs + max_waiting) // api_servers)
        self.driver = CoreClient(core, capacity, self._deliver_soon, self._observe)
        self.snapshot = EngineSnapshot(core.ready.stats, 0, time.monotonic())

    def _observe(self, outputs: list, snapshot: StatsSnapshot) -> None:
        for step in snapshot.steps:
            self.core.steps.keep(step)
        if self.feed is not None:
            self.feed.observe(outputs, snapshot.view)
        self.observe_step(outputs, EngineSnapshot(snapshot.stats, snapshot.num_held, snapshot.time))
