"""The engine core's process: the engine, stepped by the same EngineThread as in a one-process server, fed from a
ZeroMQ socket and reporting each step's outputs and snapshot on another.

The main thread only moves messages: it receives Submit/Abort/Shutdown and hands them to the engine thread's
queue, which applies them between steps exactly as in-process (engine/engine_thread.py). The engine thread sends
one StepOutputs per step from its delivery hook. Nothing here tokenises, templates or speaks HTTP: the GIL of this
process is the engine's.

The process ends when told (Shutdown), when its engine fails (EngineDead is sent first), or when the API process
that started it is gone (its parent pid changes): a core never outlives its server.
"""

import os
import signal
import threading
import time

import zmq

from ridgeline.dashboard.feed import DashboardFeed
from ridgeline.engine.engine_thread import Delivery, EngineThread
from ridgeline.engine.messages import AbortRequest
from ridgeline.errors import RidgelineError
from ridgeline.server.engine_core.messages import (Abort, CoreReady, EngineDead, Shutdown, StatsSnapshot, StepOutputs,
                                                   Submit, decode, encode)

POLL_MS = 200  # how often the main thread looks at its parent and its engine thread when no message comes


class CoreServer:
    """One engine and its two sockets, in the core's process."""

    def __init__(self, engine, inbound: str, outbound: str):
        self.engine = engine
        self.context = zmq.Context()
        self.inbound = self.context.socket(zmq.PULL)
        self.inbound.connect(inbound)
        self.outbound = self.context.socket(zmq.PUSH)
        self.outbound.setsockopt(zmq.LINGER, 1000)
        self.outbound.connect(outbound)
        self._send_lock = threading.Lock()  # the engine thread and the main thread both send; a socket is not shared
        self.feed = DashboardFeed(engine)  # only for its throttled EngineView: latencies are kept API-side
        self._last_view = self.feed.view
        self._steps_sent = engine.steps.num_recorded
        self._pending: StatsSnapshot | None = None
        self.driver = EngineThread(engine, "ridgeline-engine-core", deliver=self._ship, observers=[self._observe])

    def send(self, message) -> None:
        frame = encode(message)
        with self._send_lock:
            self.outbound.send(frame, copy=False)

    # ------------------------------------------------------------ engine thread (engine_lock held in _observe)

    def _observe(self, outputs: list) -> None:
        self.feed.observe(outputs)
        view = self.feed.view
        steps = self.engine.steps
        new_steps = steps.recent(self._steps_sent - 1) if steps.num_recorded > self._steps_sent else []
        self._steps_sent = steps.num_recorded
        snapshot = StatsSnapshot(self.engine.stats(), len(self.engine.scheduler.held), time.monotonic(),
                                 tuple(new_steps), view if view is not self._last_view else None)
        self._last_view = view
        if outputs:
            self._pending = snapshot  # goes out with this step's deliveries, in the same frame
        else:
            self.send(StepOutputs((), snapshot))

    def _ship(self, deliveries: list[Delivery]) -> None:
        snapshot, self._pending = self._pending, None
        self.send(StepOutputs(tuple(sink(item) for sink, item in deliveries), snapshot))  # (request_id, item)

    # ------------------------------------------------------------ main thread

    def ready(self) -> CoreReady:
        engine = self.engine
        return CoreReady(os.getpid(), engine.model_name, engine.admission.limits, engine.model_config.vocab_size,
                         engine.tokenizer, engine.capacity_report, engine.steps.shape, engine.steps.kv_dtype_bytes,
                         self.feed.view, engine.stats())

    def serve(self, parent_pid: int) -> int:
        """Move messages until Shutdown, the engine's failure, or the parent's end; the process's exit status."""
        self.send(self.ready())  # before the engine thread runs: nothing else reads the engine yet
        self.driver.start()
        poller = zmq.Poller()
        poller.register(self.inbound, zmq.POLLIN)
        try:
            while True:
                if not self.driver.alive:
                    self.send(EngineDead(self.driver.error or "engine stopped"))
                    return 1
                if os.getppid() != parent_pid:  # the API process died (kill -9): nobody to serve
                    self.driver.kill("API process gone")
                    return 0
                if not poller.poll(POLL_MS):
                    continue
                while True:
                    try:
                        frame = self.inbound.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    message = decode(frame.buffer)
                    if isinstance(message, Shutdown):
                        self.driver.stop()
                        return 0
                    self._apply(message)
        finally:
            self.close()

    def _apply(self, message) -> None:
        if isinstance(message, Submit):
            # The sink tags each output with its request id: deliveries become (request_id, item) pairs to ship.
            routed = [(request, lambda item, rid=request.request_id: (rid, item)) for request in message.requests]
            try:
                self.driver.submit(routed)
            except RidgelineError as error:  # an id already in flight here: the request alone fails
                self.send(StepOutputs(tuple((request.request_id, error) for request in message.requests), None))
        elif isinstance(message, Abort):
            self.driver.send([AbortRequest(request_id) for request_id in message.request_ids])
        else:
            raise TypeError(f"the engine core takes no {type(message).__name__}")

    def close(self) -> None:
        self.inbound.close(linger=0)
        self.outbound.close()
        self.context.term()


def run_core(config, inbound: str, outbound: str, parent_pid: int) -> None:
    """The core process's entry point (multiprocessing, spawn): build the engine from `config` (an EngineConfig),
    then serve until told to stop."""
    # Ctrl-C reaches the whole process group: the API process handles it and shuts this core down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ridgeline.engine.llm_engine import LLMEngine

    engine = LLMEngine(config)
    engine.populate_kv_in_background()  # the pool's pages faulted in while cores idle, not in the first steps
    server = CoreServer(engine, inbound, outbound)
    raise SystemExit(server.serve(parent_pid))
