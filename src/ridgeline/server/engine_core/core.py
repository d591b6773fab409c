"""The engine core's process: the engine, stepped by the same EngineThread as in a one-process server, fed from a
ZeroMQ socket and reporting each step's outputs and snapshot on another.

The main thread only moves messages: it receives Submit/Abort/Shutdown and hands them to the engine thread's
queue, which applies them between steps exactly as in-process (engine/engine_thread.py). The engine thread sends
one StepOutputs per step from its delivery hook. Nothing here tokenises, templates or speaks HTTP: the GIL of this
process is the engine's.

It serves one API process, or several (`serve --api-server-count N`): one socket pair each. A request's outputs go
back on the pair its Submit came in on (each sink carries its API process's index); every snapshot, CoreReady and
EngineDead goes to all of them, since each one's /metrics, /health and dashboard read the engine's state.

The process ends when told (Shutdown), when its engine fails (EngineDead is sent first), on SIGTERM (several API
processes: their supervisor sends it once they have all drained), or when the process that started it is gone
(its parent pid changes): a core never outlives its server.
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
    """One engine and a pair of sockets per API process, in the core's process. `endpoints`: (inbound, outbound)
    for each API process, in their order (the index is the API process's)."""

    def __init__(self, engine, endpoints: list[tuple[str, str]]):
        self.engine = engine
        self.context = zmq.Context()
        self.inbound: list[zmq.Socket] = []
        self.outbound: list[zmq.Socket] = []
        for inbound, outbound in endpoints:
            pull = self.context.socket(zmq.PULL)
            pull.connect(inbound)
            push = self.context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 1000)
            push.connect(outbound)
            self.inbound.append(pull)
            self.outbound.append(push)
        self._send_lock = threading.Lock()  # the engine thread and the main thread both send; a socket is not shared
        self.feed = DashboardFeed(engine)  # only for its throttled EngineView: latencies are kept API-side
        self._last_view = self.feed.view
        self._steps_sent = engine.steps.num_recorded
        self._pending: StatsSnapshot | None = None
        self.driver = EngineThread(engine, "ridgeline-engine-core", deliver=self._ship, observers=[self._observe])

    def send(self, message, to: int | None = None) -> None:
        """To API process `to`, or to every one (None)."""
        frame = encode(message)
        with self._send_lock:
            for socket in self.outbound if to is None else [self.outbound[to]]:
                socket.send(frame, copy=False)

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
        by_owner: dict[int, list] = {}
        for sink, item in deliveries:
            owner, request_id, item = sink(item)
            by_owner.setdefault(owner, []).append((request_id, item))
        # Each API process gets its own requests' outputs; the snapshot goes to all (each one's /metrics reads it),
        # in the same frame as its outputs where it has some.
        for owner in range(len(self.outbound)):
            if owner in by_owner or snapshot is not None:
                self.send(StepOutputs(tuple(by_owner.get(owner, ())), snapshot), to=owner)

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
        for socket in self.inbound:
            poller.register(socket, zmq.POLLIN)
        try:
            while True:
                if not self.driver.alive:
                    self.send(EngineDead(self.driver.error or "engine stopped"))
                    return 1
                if os.getppid() != parent_pid:  # the API process died (kill -9): nobody to serve
                    self.driver.kill("API process gone")
                    return 0
                for socket in dict(poller.poll(POLL_MS)):
                    owner = self.inbound.index(socket)
                    while True:
                        try:
                            frame = socket.recv(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        message = decode(frame.buffer)
                        if isinstance(message, Shutdown):
                            self.driver.stop()
                            return 0
                        self._apply(message, owner)
        finally:
            self.close()

    def _apply(self, message, owner: int) -> None:
        if isinstance(message, Submit):
            # The sink tags each output with the API process it goes back to and its request id: deliveries become
            # (owner, request_id, item) triples to ship.
            routed = [(request, lambda item, rid=request.request_id: (owner, rid, item)) for request in message.requests]
            try:
                self.driver.submit(routed)
            except RidgelineError as error:  # an id already in flight here: the request alone fails
                self.send(StepOutputs(tuple((request.request_id, error) for request in message.requests), None),
                          to=owner)
        elif isinstance(message, Abort):
            self.driver.send([AbortRequest(request_id) for request_id in message.request_ids])
        else:
            raise TypeError(f"the engine core takes no {type(message).__name__}")

    def close(self) -> None:
        for socket in self.inbound:
            socket.close(linger=0)
        for socket in self.outbound:
            socket.close()
        self.context.term()


def run_core(config, endpoints: list[tuple[str, str]], parent_pid: int) -> None:
    """The core process's entry point (multiprocessing, spawn): build the engine from `config` (an EngineConfig),
    then serve the API processes at `endpoints` until told to stop."""
    # A process group of its own: Ctrl-C on a terminal, or a SIGTERM to the whole group (`timeout`), reaches the
    # process that started this core, which stops it in order once its requests have drained (Shutdown; with
    # several API processes, their supervisor once none is left), not before. SIGTERM itself is still obeyed:
    # multiprocessing ends a daemon child so at exit, and joins it. SIGINT is ignored should one arrive anyway.
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ridgeline.engine.llm_engine import LLMEngine

    engine = LLMEngine(config)
    engine.populate_kv_in_background()  # the pool's pages faulted in while cores idle, not in the first steps
    server = CoreServer(engine, endpoints)
    raise SystemExit(server.serve(parent_pid))
