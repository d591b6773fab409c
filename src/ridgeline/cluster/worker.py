"""A worker: one `LLMEngine` on its engine thread (engine/engine_thread.py, the same driver the one-model server
uses), behind the small thread-safe API the router speaks.

This is the unit the router places requests on, in-process or inside a Ray actor (ray_worker.py), and the unit
that disaggregated prefill/decode (issue #12) builds its roles on. The API, all of it callable from any thread:

    worker = EngineWorker(engine, worker_id="gemma-0", role="both")   # role: "both" | "prefill" | "decode"
    worker.start()
    worker.info                  -> WorkerInfo   (model, block size, context, pages: fixed for the worker's life)
    worker.submit(request, sink) -> None         (GenerateRequest; sink(RequestOutput) is called from the engine
                                                  thread for every step's output, the last one has .finished, or
                                                  once with ReplicaRejected / ReplicaFailed; raises
                                                  ReplicaUnavailable (ReplicaBusy) if it cannot accept now)
    worker.abort(request_id)                     (frees the request's KV pages before its next step; its sink gets
                                                  a final output with finish_reason "abort")
    worker.status()              -> WorkerStatus (backlog of uncomputed prompt tokens, running/waiting, and the
                                                  prefix-cache block hashes stored/removed since the last call)
    worker.stop() / worker.kill(reason)          (every request still in flight gets ReplicaFailed; kill is for
                                                  tests and for a supervisor that lost the engine)

A prefill role would submit with max_tokens=1 and keep the pages (the engine's kv_manifest names them by the
same sha256 block hashes the router sees in `CacheEvents`); a decode role would admit a request whose pages
arrive from elsewhere. Both keep this submit/abort/status/sink contract, so the router, its load accounting and
its health checks treat them like any other worker.
"""

import threading
import time
from collections.abc import Callable

from ridgeline.cluster.errors import ReplicaBusy, ReplicaFailed, ReplicaRejected, ReplicaUnavailable
from ridgeline.cluster.messages import CacheEvents, GenerateRequest, WorkerInfo, WorkerStatus
from ridgeline.engine.engine_thread import EngineDeadError, EngineRefused, EngineThread
from ridgeline.engine.messages import AddRequest
from ridgeline.engine.outputs import RequestOutput
from ridgeline.errors import RidgelineError

Sink = Callable[[RequestOutput | ReplicaFailed | ReplicaRejected], None]


class EngineWorker:
    def __init__(self, engine, worker_id: str, role: str = "both", max_in_flight: int | None = None):
        self.engine = engine
        scheduler = engine.scheduler
        manager = scheduler.block_manager
        self.info = WorkerInfo(worker_id, engine.model_name, role, manager.block_size, engine.admission.limits,
                               manager.num_pages, manager.num_pages // len(manager.windows))
        # Publish the names of one full-attention group: it keeps every block, so it bounds what a prompt can hit.
        self._published_group = next((g for g, w in enumerate(manager.windows) if w is None), 0)
        if manager.prefix_cache is not None:
            manager.prefix_cache.events = []
        self.max_in_flight = max_in_flight or scheduler.config.max_num_seqs * 2
        self._events_lock = threading.Lock()
        self._events = CacheEvents()
        self.driver = EngineThread(engine, f"ridgeline-worker-{worker_id}", capacity=self.max_in_flight,
                                   observers=[self._take_cache_events], detailed_backlog=True)

    def start(self) -> "EngineWorker":
        self.driver.start()
        return self

    @property
    def alive(self) -> bool:
        return self.driver.alive

    @property
    def error(self) -> str | None:
        return self.driver.error

    def submit(self, request: GenerateRequest, sink: Sink) -> None:
        """Admission runs here, on the caller's thread (it is pure); a request at fault reaches `sink` as
        ReplicaRejected, like one the engine refuses, so every caller handles refusals in one place."""
        worker_id = self.info.worker_id

        def translate(item) -> None:
            if isinstance(item, EngineDeadError):
                item = ReplicaFailed(f"worker {worker_id} failed with request {request.request_id} in flight: {item}")
            elif isinstance(item, RidgelineError):
                item = ReplicaRejected(f"request refused by worker {worker_id}: {item}")
            sink(item)

        try:
            admitted = self.engine.admission.admit(list(request.prompt_token_ids), request.params)
            self.driver.submit([(AddRequest(request.request_id, admitted, time.monotonic()), translate)])
        except RidgelineError as error:
            translate(error)
        except EngineRefused as refused:
            if refused.full:
                raise ReplicaBusy(f"worker {worker_id} is at capacity", retry_after=1.0) from None
            raise ReplicaUnavailable(f"worker {worker_id} is not running ({self.error or 'stopped'})") from None

    def abort(self, request_id: str) -> None:
        self.driver.abort(request_id)

    def status(self) -> WorkerStatus:
        backlog = self.driver.backlog()
        pages = self.engine.scheduler.block_manager
        with self._events_lock:
            events, self._events = self._events, CacheEvents()
        return WorkerStatus(self.info.worker_id, self.alive, backlog.received, backlog.num_running,
                            backlog.num_waiting, backlog.queued_prefill_tokens, events, self.error,
                            prefill_remaining=backlog.prefill_remaining,
                            # read without the engine's lock, as the backlog's counts are: a step's worth stale
                            num_free_pages=pages.num_free_pages, num_total_pages=pages.num_pages)

    def stop(self) -> None:
        self.driver.stop()

    def kill(self, reason: str = "killed") -> None:
        """The worker is gone: every request in flight fails now, with `reason`, and new ones are refused."""
        self.driver.kill(reason)

    # ------------------------------------------------------------ engine thread

    def _take_cache_events(self, outputs: list[RequestOutput]) -> None:
        cache = self.engine.scheduler.block_manager.prefix_cache
        if cache is not None and cache.events:
            with self._events_lock:
                self._collect_events(cache.events)
            cache.events.clear()

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
