"""A decode server's ReceiveKV, as message handlers on its engine thread (engine/engine_thread.py): reserve pages
on the engine thread, fetch them on a thread of their own (the engine keeps stepping meanwhile), commit them back
on the engine thread. No free pages yet: the driver offers the message again after the next step.

From the moment a request is taken (`accept`, on the event loop, before the engine thread has seen it) until its
pull starts, a LeaseKeeper (server/kv_leases.py) keeps the prefill worker's lease on its pages alive from a thread
of its own, so however long the request waits for room, or however long this engine's steps take, the pages are
there when it pulls. At most `max_waiting` requests wait so (taken, no pages reserved yet): past it a new one is
refused with 503 `kv_queue_full` (and /v1/kv/lookup says `accepting: false`, so a front refuses before it spends a
prefill).

A transfer that fails because the pages are gone (their lease lapsed, their prefill worker restarted or cannot be
reached, a page damaged on the way) fails its request with 503 `kv_pages_gone`: the request was valid, and a front
prefills it again. One that no prefill can fix (the two workers' KV layouts differ) is a 502 `kv_transfer_failed`.
"""

import threading
import time
from dataclasses import dataclass

from ridgeline.cluster.handoff import MAX_KV_WAITING
from ridgeline.cluster.kv_transfer.messages import TransferFailed
from ridgeline.cluster.kv_transfer.receiver import KVTransport, commit, fetch, reserve
from ridgeline.engine.engine_thread import EngineThread
from ridgeline.engine.kv_handoff import PageRef
from ridgeline.engine.messages import AbortRequest, ReceiveKV
from ridgeline.errors import RidgelineError
from ridgeline.server.errors import APIError
from ridgeline.server.kv_leases import LeaseKeeper
from ridgeline.server.metrics import ServerMetrics

# MAX_KV_WAITING (cluster/handoff.py): requests taken and waiting for room here, beyond which new ones are refused


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
    retriable: bool = True  # the pages are gone, not unusable: prefilling again can succeed
    while_waiting: bool = False  # from the lease keeper: only for a request not yet reserved


def transfer_error(reason: str, retriable: bool) -> APIError:
    if retriable:
        return APIError(503, f"KV transfer failed, the prefilled pages are gone: {reason}; prefill the request again",
                        code="kv_pages_gone", headers={"Retry-After": "1"})
    return APIError(502, f"KV transfer failed: {reason}", code="kv_transfer_failed")


class KVIntake:
    def __init__(self, transport: KVTransport | None, metrics: ServerMetrics, max_waiting: int = MAX_KV_WAITING):
        self.transport = transport  # None: not a decode worker, and a ReceiveKV fails saying so
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.driver: EngineThread | None = None
        self.keeper = LeaseKeeper(transport, on_lost=self._lost) if transport is not None else None
        # Requests taken and not yet given pages (their leases kept alive meanwhile): added on the event loop,
        # removed on the engine thread.
        self._waiting: set[str] = set()
        self._mutex = threading.Lock()

    def install(self, driver: EngineThread) -> None:
        self.driver = driver
        driver.handlers.update({ReceiveKV: self._receive, _KVArrived: self._arrived, _KVFailed: self._failed,
                                AbortRequest: self._aborted})

    # ------------------------------------------------------------ event loop

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def accepting(self) -> bool:
        return len(self._waiting) < self.max_waiting

    def accept(self, messages: list) -> None:
        """Take these ReceiveKVs (before they are submitted): their leases are kept alive from now on. A 503
        `kv_queue_full` if that would make more than max_waiting wait."""
        taken = [m for m in messages if isinstance(m, ReceiveKV)]
        if not taken:
            return
        with self._mutex:
            if len(self._waiting) + len(taken) > self.max_waiting:
                raise APIError(503, f"this decode worker has {len(self._waiting)} requests waiting for KV room "
                                    f"(at most {self.max_waiting}); retry later", code="kv_queue_full",
                               headers={"Retry-After": "1"})
            self._waiting.update(m.request_id for m in taken)
        if self.keeper is not None:
            for m in taken:
                self.keeper.hold(m.request_id, m.source_address, m.manifest.request_id, m.lease_seconds)

    def withdraw(self, messages: list) -> None:
        """The ReceiveKVs accept() took were not submitted after all."""
        for m in messages:
            if isinstance(m, ReceiveKV):
                self._settle(m.request_id)

    def _settle(self, request_id: str) -> bool:
        """No longer waiting (reserved, failed or aborted); whether it was."""
        if self.keeper is not None:
            self.keeper.let_go(request_id)
        with self._mutex:
            if request_id in self._waiting:
                self._waiting.discard(request_id)
                return True
        return False

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close()

    # ------------------------------------------------------------ lease keeper's thread

    def _lost(self, request_id: str, reason: str) -> None:
        if self.driver is not None:
            self.driver.send([_KVFailed(request_id, reason, retriable=True, while_waiting=True)])

    # ------------------------------------------------------------ engine thread

    def _receive(self, message: ReceiveKV) -> bool:
        if self.transport is None:
            return self._failed(_KVFailed(message.request_id, "this server is not a decode worker (no KV transport)",
                                          retriable=False))
        engine = self.driver.engine
        try:
            refs = reserve(engine, message.request_id, message.request, message.manifest, message.first_logprobs)
        except TransferFailed as error:
            return self._failed(_KVFailed(message.request_id, error.reason, error.retriable))
        except RidgelineError as error:
            return self._failed(_KVFailed(message.request_id, str(error), retriable=False))
        if refs is None:
            return False  # no room yet: offered again after the next step; its lease is kept alive meanwhile
        self._settle(message.request_id)  # the pull, about to go out, extends the lease from here
        layout = engine.kv_layout()

        def pull() -> None:
            started = time.monotonic()
            try:
                payloads = fetch(self.transport, message.source_address, message.manifest, refs, layout)
            except TransferFailed as error:
                self.driver.send([_KVFailed(message.request_id, error.reason, error.retriable)])
                return
            self.driver.send([_KVArrived(message.request_id, refs, payloads, time.monotonic() - started)])

        threading.Thread(target=pull, name=f"kv-fetch-{message.request_id}", daemon=True).start()
        return True

    def _arrived(self, message: _KVArrived) -> bool:
        try:
            commit(self.driver.engine, message.request_id, message.refs, message.payloads)
        except RidgelineError:
            return True  # aborted while its pages were on their way: the abort freed them
        self.metrics.observe_kv_received(len(message.refs), sum(map(len, message.payloads)), message.seconds)
        return True

    def _aborted(self, message: AbortRequest) -> bool:
        self._settle(message.request_id)  # (the driver dropped its ReceiveKV)
        return True

    def _failed(self, message: _KVFailed) -> bool:
        was_waiting = self._settle(message.request_id)
        if message.while_waiting and not was_waiting:
            return True  # the keeper's news came after the request got its pages and pulled: nothing is lost
        self.driver.drop_waiting(message.request_id)  # a request still waiting for room: its ReceiveKV is deferred
        self.driver.engine.abort(message.request_id)
        self.metrics.kv_transfers_failed.inc()
        self.driver.fail(message.request_id, transfer_error(message.reason, message.retriable))
        return True
