"""The prefill side of KV transfers: serves pulls from the pages an engine holds for finished requests, under
leases, so pages nobody collects are freed too.

A lease starts when a request's KV is offered and is extended by every message about it (a live decode side
pulling); it lapses after `lease_seconds` of silence, and `expire()` (called by the transport's loop) frees the
pages of lapsed leases. Every request ends released exactly once: on Done, on Failed, on lapse, or on drop().
"""

import threading
import time
from collections.abc import Callable
from contextlib import nullcontext

from ridgeline.cluster.kv_transfer.messages import Done, Failed, KeepAlive, Message, Pages, Pull
from ridgeline.engine.kv_handoff import KVHandoffError, KVManifest, payload_digest


class KVSource:
    def __init__(self, engine, lease_seconds: float = 30.0, lock: "threading.Lock | None" = None,
                 clock: Callable[[], float] = time.monotonic):
        """`engine`: an LLMEngine (offer_kv, read_kv_pages, release_kv, kv_layout). `lock`: held around every
        engine call, when the engine steps on another thread that takes the same lock."""
        self.engine = engine
        self.lease_seconds = lease_seconds
        self.layout_digest = engine.kv_layout().digest()
        self._lock = lock or nullcontext()
        self._clock = clock
        self._leases: dict[str, float] = {}  # request id -> when its lease lapses
        self.num_released = 0
        self.num_lapsed = 0

    def offer(self, request_id: str) -> KVManifest:
        """The manifest of a finished hold_kv request (for the decode side), starting its lease."""
        with self._lock:
            manifest = self.engine.offer_kv(request_id)
        self._leases[request_id] = self._clock() + self.lease_seconds
        return manifest

    @property
    def num_leased(self) -> int:
        return len(self._leases)

    def handle(self, message: Message) -> tuple[Message | None, list[bytes]]:
        """One message from a decode side; returns the reply (None: none) and its page frames."""
        request_id = message.request_id
        if request_id not in self._leases:
            return Failed(request_id, f"no KV held for request {request_id!r} (never offered, collected, or its "
                                      f"lease lapsed)"), []
        if isinstance(message, Pull):
            if message.layout_digest != self.layout_digest:
                self.drop(request_id)
                return Failed(request_id, "KV layouts differ (model, weights, KV dtype, block size or layer groups): "
                                          "this prefill worker and that decode worker cannot share pages"), []
            self._leases[request_id] = self._clock() + self.lease_seconds
            try:
                with self._lock:
                    payloads = self.engine.read_kv_pages(request_id, list(message.pages))
            except (KVHandoffError, IndexError) as error:
                self.drop(request_id)
                return Failed(request_id, f"cannot read the pages asked for: {error}"), []
            return Pages(request_id, message.pages, tuple(payload_digest(p) for p in payloads)), payloads
        if isinstance(message, KeepAlive):  # a decode side still waiting for room to take them
            self._leases[request_id] = self._clock() + self.lease_seconds
            return message, []
        if isinstance(message, (Done, Failed)):
            self.drop(request_id)
        return None, []

    def drop(self, request_id: str) -> None:
        """Free a request's pages now (collected, failed, or its client gone before decode)."""
        if self._leases.pop(request_id, None) is not None:
            with self._lock:
                self.engine.release_kv(request_id)
            self.num_released += 1

    def expire(self) -> list[str]:
        """Free the pages of every lapsed lease, and of held requests never offered (their answer never went out:
        the client left first) once a lease's time has passed since they finished; returns their request ids."""
        now = self._clock()
        with self._lock:
            never_offered = [request_id for request_id, seq in self.engine.scheduler.held.items()
                             if request_id not in self._leases and seq.finish_time is not None
                             and seq.finish_time + self.lease_seconds <= time.monotonic()]
            for request_id in never_offered:
                self.engine.release_kv(request_id)
        lapsed = [request_id for request_id, deadline in self._leases.items() if deadline <= now]
        for request_id in lapsed:
            self.drop(request_id)
        self.num_lapsed += len(lapsed)
        return lapsed
