"""Keeping a prefill worker's lease on a request's pages alive from the other side, on a thread of its own.

A prefill worker frees held pages after `lease_seconds` of silence about them (cluster/kv_transfer/source.py).
Whoever is carrying the request towards its pull says, every `min(KEEP_ALIVE_SECONDS, lease / 4)`, that it is still
coming: the front from the prefill worker's answer until a decode worker has taken the request; the decode worker
from taking it until its pull starts. The keep-alives go out from this keeper's thread straight to the prefill
worker's KV endpoint (whose thread answers them without the engine), batched per prefill worker, so neither a busy
event loop nor a long engine step on either side can let a lease lapse while its request is on its way.

A keep-alive answered "not held" (or a prefill worker gone) calls `on_lost(key, reason)`; one not answered in time
is tried again at the next tick (the lease is four ticks long).
"""

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ridgeline.cluster.kv_transfer.messages import TransferFailed

logger = logging.getLogger("ridgeline.server.kv_leases")

KEEP_ALIVE_SECONDS = 5.0  # at most; a shorter lease is kept alive four times per lease


@dataclass
class _Held:
    address: str  # the prefill worker's KV endpoint
    request_id: str  # the request's id there
    every: float
    due: float


class LeaseKeeper:
    def __init__(self, transport, on_lost: Callable[[Hashable, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, name: str = "ridgeline-kv-leases",
                 threaded: bool = True):
        """`transport`: a KV transport with keep_alive_many (ZmqTransport, InProcessTransport). `threaded` False:
        nothing ticks but the caller (a test with a fake clock)."""
        self.transport = transport
        self.on_lost = on_lost
        self._clock = clock
        self._held: dict[Hashable, _Held] = {}
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._name = name
        self._thread: threading.Thread | None = None
        self._threaded = threaded
        self.num_sent = 0
        self.num_lost = 0

    def hold(self, key: Hashable, address: str, request_id: str, lease_seconds: float | None = None) -> None:
        """Keep `request_id`'s pages at `address` alive until let_go(key); the first keep-alive goes out one
        interval from now (whoever handed the request over kept the lease alive until then)."""
        every = min(KEEP_ALIVE_SECONDS, (lease_seconds or 4 * KEEP_ALIVE_SECONDS) / 4)
        with self._mutex:
            self._held[key] = _Held(address, request_id, every, self._clock() + every)
        self._start()
        self._wake.set()

    def let_go(self, key: Hashable) -> None:
        with self._mutex:
            self._held.pop(key, None)

    def holds(self, key: Hashable) -> bool:
        return key in self._held

    @property
    def num_held(self) -> int:
        return len(self._held)

    def tick(self) -> list[Hashable]:
        """Send the keep-alives that are due, batched per prefill worker; returns the keys found lost."""
        now = self._clock()
        with self._mutex:
            due = [(key, held) for key, held in self._held.items() if held.due <= now]
        by_address: dict[str, list[tuple[Hashable, _Held]]] = {}
        for key, held in due:
            by_address.setdefault(held.address, []).append((key, held))
        lost: list[tuple[Hashable, _Held, str]] = []
        for address, entries in by_address.items():
            try:
                answers = self.transport.keep_alive_many(address, [held.request_id for _, held in entries])
            except TransferFailed as error:  # the prefill worker is gone, and its pages with it
                lost += [(key, held, error.reason) for key, held in entries]
                continue
            self.num_sent += len(entries)
            for key, held in entries:
                if held.request_id not in answers:
                    continue  # no answer in time: the next tick asks again, well inside the lease
                if answers[held.request_id] is not None:
                    lost.append((key, held, answers[held.request_id]))
                else:
                    held.due = self._clock() + held.every
        reported = []
        for key, held, reason in lost:
            with self._mutex:
                if self._held.get(key) is not held:
                    continue  # let go meanwhile (its pull started, or it was aborted): nothing is lost
                del self._held[key]
            self.num_lost += 1
            reported.append(key)
            if self.on_lost is not None:
                self.on_lost(key, reason)
        return reported

    def _start(self) -> None:
        if self._threaded and self._thread is None:
            with self._mutex:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a keeper that dies lets every lease lapse: log and go on
                logger.exception("keeping KV leases alive failed")
            with self._mutex:
                next_due = min((held.due for held in self._held.values()), default=None)
            wait = 1.0 if next_due is None else min(1.0, max(0.01, next_due - self._clock()))
            self._wake.wait(wait)
            self._wake.clear()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
