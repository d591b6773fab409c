"""A decode server's ReceiveKV, as message handlers on its engine thread (engine/engine_thread.py): reserve pages
on the engine thread, fetch them on a thread of their own (the engine keeps stepping meanwhile), commit them back
on the engine thread. No free pages yet: the driver offers the message again after the next step, and meanwhile
the prefill worker is told every KEEP_ALIVE_SECONDS that its pages are still wanted, so a request that waits here
longer than the prefill side's lease (behind a burst of long prompts) is not failed by that lease lapsing."""

import threading
import time
from dataclasses import dataclass

from ridgeline.cluster.kv_transfer.messages import TransferFailed
from ridgeline.cluster.kv_transfer.receiver import KVTransport, commit, fetch, reserve
from ridgeline.engine.engine_thread import EngineThread
from ridgeline.engine.kv_handoff import PageRef
from ridgeline.engine.messages import AbortRequest, ReceiveKV
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


@dataclass(frozen=True)
class _LeaseExtended:
    """From a keep-alive thread: the prefill side holds the pages of a request still waiting for room here."""

    request_id: str


# Well inside the prefill side's lease (30 s by default): a waiting request's pages are never let lapse.
KEEP_ALIVE_SECONDS = 5.0


class KVIntake:
    def __init__(self, transport: KVTransport | None, metrics: ServerMetrics):
        self.transport = transport  # None: not a decode worker, and a ReceiveKV fails saying so
        self.metrics = metrics
        self.driver: EngineThread | None = None
        # Requests waiting for room: when their lease was last extended (inf: a keep-alive is on its way). Only
        # touched on the engine thread.
        self._waiting: dict[str, float] = {}

    def install(self, driver: EngineThread) -> None:
        self.driver = driver
        driver.handlers.update({ReceiveKV: self._receive, _KVArrived: self._arrived, _KVFailed: self._failed,
                                _LeaseExtended: self._lease_extended, AbortRequest: self._aborted})

    def _receive(self, message: ReceiveKV) -> bool:
        if self.transport is None:
            return self._failed(_KVFailed(message.request_id, "this server is not a decode worker (no KV transport)"))
        engine = self.driver.engine
        try:
            refs = reserve(engine, message.request_id, message.request, message.manifest, message.first_logprobs)
        except (TransferFailed, RidgelineError) as error:
            return self._failed(_KVFailed(message.request_id, str(error)))
        if refs is None:
            self._keep_lease(message)
            return False
        self._waiting.pop(message.request_id, None)
        layout = engine.kv_layout()

        def pull() -> None:
            started = time.monotonic()
            try:
                payloads = fetch(self.transport, message.source_address, message.manifest, refs, layout)
            except TransferFailed as error:
                self.driver.send([_KVFailed(message.request_id, error.reason)])
                return
            self.driver.send([_KVArrived(message.request_id, refs, payloads, time.monotonic() - started)])

        threading.Thread(target=pull, name=f"kv-fetch-{message.request_id}", daemon=True).start()
        return True

    def _keep_lease(self, message: ReceiveKV) -> None:
        now = time.monotonic()
        if now - self._waiting.setdefault(message.request_id, now) < KEEP_ALIVE_SECONDS:
            return
        self._waiting[message.request_id] = float("inf")  # one keep-alive at a time

        def extend() -> None:
            try:
                self.transport.keep_alive(message.source_address, message.manifest.request_id)
            except TransferFailed as error:
                self.driver.send([_KVFailed(message.request_id, error.reason)])
                return
            self.driver.send([_LeaseExtended(message.request_id)])

        threading.Thread(target=extend, name=f"kv-keep-alive-{message.request_id}", daemon=True).start()

    def _lease_extended(self, message: _LeaseExtended) -> bool:
        if message.request_id in self._waiting:  # (not already reserved and pulling)
            self._waiting[message.request_id] = time.monotonic()
        return True

    def _arrived(self, message: _KVArrived) -> bool:
        try:
            commit(self.driver.engine, message.request_id, message.refs, message.payloads)
        except RidgelineError:
            return True  # aborted while its pages were on their way: the abort freed them
        self.metrics.observe_kv_received(len(message.refs), sum(map(len, message.payloads)), message.seconds)
        return True

    def _aborted(self, message: AbortRequest) -> bool:
        self._waiting.pop(message.request_id, None)  # (the driver dropped its ReceiveKV)
        return True

    def _failed(self, message: _KVFailed) -> bool:
        self._waiting.pop(message.request_id, None)
        self.driver.drop_waiting(message.request_id)  # a keep-alive that failed: its ReceiveKV is still deferred
        self.driver.engine.abort(message.request_id)
        self.metrics.kv_transfers_failed.inc()
        self.driver.fail(message.request_id,
                         APIError(502, f"KV transfer failed: {message.reason}", code="kv_transfer_failed"))
        return True
