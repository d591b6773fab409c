"""A worker: one `LLMEngine` stepped by its own thread, driven through a small thread-safe API.

This is the unit the router places requests on, in-process or inside a Ray actor (ray_worker.py), and the unit
that disaggregated prefill/decode (issue #12) builds its roles on. The API, all of it callable from any thread:

    worker = EngineWorker(engine, worker_id="gemma-0", role="both")   # role: "both" | "prefill" | "decode"
    worker.start()
    worker.info                  -> WorkerInfo   (model, block size, context, pages: fixed for the worker's life)
    worker.submit(request, sink) -> None         (GenerateRequest; sink(RequestOutput | ReplicaFailed) is called
                                                  from the engine thread for every step's output, the last one
                                                  has .finished; raises ReplicaUnavailable if it cannot accept)
    worker.abort(request_id)                     (frees the request's KV pages before its next step; its sink gets
                                                  a final output with finish_reason "abort")
    worker.status()              -> WorkerStatus (backlog of uncomputed prompt tokens, running/waiting, and the
                                                  prefix-cache block hashes stored/removed since the last call)
    worker.stop() / worker.kill(reason)          (kill: every request in flight gets ReplicaFailed; for tests
                                                  and for a supervisor that lost the engine)

A prefill role would submit with max_tokens=1 and keep the pages (the engine's kv_manifest names them by the
same sha256 block hashes the router sees in `CacheEvents`); a decode role would admit a request whose pages
arrive from elsewhere. Both keep this submit/abort/status/sink contract, so the router, its load accounting and
its health checks treat them like any other worker.
"""

import threading
from collections.abc import Callable

from ridgeline.cluster.errors import ReplicaBusy, ReplicaFailed, ReplicaRejected, ReplicaUnavailable
from ridgeline.cluster.messages import CacheEvents, GenerateRequest, WorkerInfo, WorkerStatus
from ridgeline.engine.outputs import RequestOutput
from ridgeline.errors import RidgelineError

Sink = Callable[[RequestOutput | ReplicaFailed | ReplicaRejected], None]


class EngineWorker:
    def __init__(self, engine, worker_id: str, role: str = "both", max_in_flight: int | None = None):
        self.engine = engine
        scheduler = engine.scheduler
        manager = scheduler.block_manager
        self.info = WorkerInfo(worker_id, engine.model_name, role, manager.block_size, engine.admission.limits,
                               manager.num_pages)
        # Publish the names of one full-attention group: it keeps every block, so it bounds what a prompt can hit.
        self._published_group = next((g for g, w in enumerate(manager.windows) if w is None), 0)
        if manager.prefix_cache is not None:
            manager.prefix_cache.events = []
        self.max_in_flight = max_in_flight or scheduler.config.max_num_seqs * 2
        self._lock = threading.Condition()
        self._commands: list[tuple] = []
        self._sinks: dict[str, tuple[Sink, int]] = {}  # request id -> sink, prompt tokens
        self._received = 0
        self._backlog = 0  # uncomputed prompt tokens of admitted requests, after the last step
        self._pending_prompt_tokens = 0  # prompt tokens of requests not yet handed to the engine
        self._events = CacheEvents()
        self._stop = False
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"ridgeline-worker-{worker_id}", daemon=True)

    # ------------------------------------------------------------ any thread

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def submit(self, request: GenerateRequest, sink: Sink) -> None:
        with self._lock:
            if not self.alive or self._stop:
                raise ReplicaUnavailable(f"worker {self.info.worker_id} is not running ({self.error or 'stopped'})")
            if len(self._sinks) >= self.max_in_flight:
                raise ReplicaBusy(f"worker {self.info.worker_id} is at capacity", retry_after=1.0)
            self._sinks[request.request_id] = (sink, len(request.prompt_token_ids))
            self._received += 1
            self._pending_prompt_tokens += len(request.prompt_token_ids)
            self._commands.append(("add", request))
            self._lock.notify()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._commands.append(("abort", request_id))
            self._lock.notify()

    def status(self) -> WorkerStatus:
        with self._lock:
            events, self._events = self._events, CacheEvents()
            return WorkerStatus(self.info.worker_id, self.alive, self._received, self.engine.scheduler.num_running,
                                self.engine.scheduler.num_waiting, self._backlog + self._pending_prompt_tokens,
                                events, self.error)

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def kill(self, reason: str = "killed") -> None:
        """The worker is gone: every request in flight fails now, with `reason`, and new ones are refused."""
        with self._lock:
            self.error = reason
            self._stop = True
            sinks, self._sinks = self._sinks, {}
            self._lock.notify()
        for request_id, (sink, _) in sinks.items():
            sink(ReplicaFailed(f"worker {self.info.worker_id} failed with request {request_id} in flight: {reason}"))

    # ------------------------------------------------------------ engine thread

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                with self._lock:
                    while not self._commands and not self._stop and not engine.has_work():
                        self._lock.wait()
                    commands, self._commands = self._commands, []
                    if self._stop:
                        return
                for command in commands:
                    self._apply(command)
                outputs = engine.step() if engine.has_work() else []
                self._after_step(outputs)
        except BaseException as error:  # noqa: BLE001 - whatever broke the engine must reach every waiting request
            self.kill(f"engine failed: {error!r}")
            raise

    def _apply(self, command: tuple) -> None:
        if command[0] == "abort":
            self.engine.abort(command[1])
            return
        request: GenerateRequest = command[1]
        with self._lock:
            self._pending_prompt_tokens -= len(request.prompt_token_ids)
        try:
            self.engine.add_request(request.request_id, request.prompt_token_ids, request.params)
        except RidgelineError as error:  # the request is at fault, not the worker
            with self._lock:
                route = self._sinks.pop(request.request_id, None)
            if route is not None:
                route[0](ReplicaRejected(f"request refused by worker {self.info.worker_id}: {error}"))

    def _after_step(self, outputs: list[RequestOutput]) -> None:
        scheduler = self.engine.scheduler
        backlog = sum(max(0, seq.num_prompt_tokens - seq.num_computed_tokens)
                      for queue in (scheduler.waiting, scheduler.running) for seq in queue)
        cache = scheduler.block_manager.prefix_cache
        with self._lock:
            self._backlog = backlog
            if cache is not None and cache.events:
                self._collect_events(cache.events)
                cache.events.clear()
            deliveries = []
            for output in outputs:
                route = self._sinks.get(output.request_id)
                if route is not None:
                    deliveries.append((route[0], output))
                    if output.finished:
                        del self._sinks[output.request_id]
        for sink, output in deliveries:
            sink(output)

    def _collect_events(self, events: list) -> None:
        """Fold the cache's events into the net change since the last report (a block stored then evicted
        between two reports need not travel at all)."""
        stored = dict.fromkeys(self._events.stored)
        removed = dict.fromkeys(self._events.removed)
        cleared = self._events.cleared
        for kind, name in events:
            if kind == "cleared":
                stored, removed, cleared = {}, {}, True
            elif name[0] == self._published_group:
                gained, lost = (stored, removed) if kind == "stored" else (removed, stored)
                if lost.pop(name[1], 0) is None and kind == "removed":
                    continue  # stored and removed within one report: the router never knew of it
                gained[name[1]] = None
        self._events = CacheEvents(list(stored), list(removed), cleared)
