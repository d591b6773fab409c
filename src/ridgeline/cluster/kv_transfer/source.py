"""The prefill side of KV transfers: serves pulls from the pages an engine holds for finished requests, under
leases, so pages nobody collects are freed too.

A lease starts when a request's KV is offered (the prefill worker's answer names the pages: the decode side is
being told) and is extended by every message about it (a pull, a keep-alive from the decode side or the front
carrying the request); it lapses after `lease_seconds` of silence, and `expire()` (called by the transport's loop)
frees the pages of lapsed leases. Every request ends released exactly once: on Done, on Failed, on lapse, or on
drop().

Attached to the engine's thread (`attach`, what a prefill worker server does), the source never waits on the
engine: the manifest of a finished request is built on the engine thread as the step that finished it ends
(`prepare`), so offering it is a dict lookup; a pull reads pages the engine no longer touches (a held request's
pages are written once and freed only through this source) under the source's own mutex, not the engine's lock;
and a release is a message the engine thread applies before its next step. Keep-alives and pulls are therefore
answered at once however long the engine's steps take, and an answer that reaches its client late cannot find
its pages gone: its lease starts only then. Unattached (tests, one thread), every engine call takes `lock`.

A front may name a request itself (`expect`) and release it by that name (`release`) whether or not its answer
reached it: a front cancelled while the answer is on the wire never learns the id here, and without its word the
pages would stay held a whole lease (issue 38). A name released before it is known here is remembered for a
lease's time, and a request released before it finished is freed as it finishes, so an answer produced after the
release never holds pages.
"""

import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from collections import OrderedDict
from dataclasses import dataclass

from ridgeline.cluster.kv_transfer.messages import (LAYOUT_MISMATCH, Done, Failed, KeepAlive, Message, Pages, Pull,
                                                    TransferFailed)
from ridgeline.engine.kv_handoff import KVHandoffError, KVManifest, payload_digest


# Names released before they were known here, remembered at most this many (oldest forgotten first): a bound on what
# a front that releases names it never sent can make a worker keep.
MAX_EARLY_RELEASES = 65536


class PagesGone(TransferFailed):
    """A request's held pages are no longer here (lapsed, released, or never kept)."""


@dataclass(frozen=True)
class ReleaseHeld:
    """To an engine thread: free the pages a finished hold_kv request kept."""

    request_id: str


class KVSource:
    def __init__(self, engine, lease_seconds: float = 30.0, lock: "threading.Lock | None" = None,
                 clock: Callable[[], float] = time.monotonic):
        """`engine`: an LLMEngine (offer_kv, read_kv_pages, release_kv, kv_layout). `lock`: held around every
        engine call while unattached, when the engine steps on another thread that takes the same lock."""
        self.engine = engine
        self.lease_seconds = lease_seconds
        self.layout_digest = engine.kv_layout().digest()
        self._lock = lock or nullcontext()
        self._clock = clock
        # Guards everything below; held around a page read, so a release never frees pages mid-read. Never held
        # around an engine call that waits for the engine.
        self._mutex = threading.RLock()
        self._leases: dict[str, float] = {}  # request id -> when its lease lapses
        self._prepared: dict[str, tuple[KVManifest, float]] = {}  # finished, not yet offered: manifest, deadline
        self._release: Callable[[str], None] | None = None  # attached: hands a release to the engine thread
        # A front's names for its requests (expect/release). Own lock, never held around anything that waits, so
        # the event loop can take it; taken inside _mutex where both are needed, never the other way round.
        self._names_mutex = threading.Lock()
        self._by_name: dict[str, str] = {}  # a front's name -> the request's id here
        self._name_of: dict[str, str] = {}  # the reverse
        self._doomed: set[str] = set()  # ids here released by name before they finished: freed as they do
        self._released_early: OrderedDict[str, float] = OrderedDict()  # names released before known -> until when
        self.num_released = 0
        self.num_lapsed = 0

    # ------------------------------------------------------------ the engine's thread

    def attach(self, thread) -> None:
        """Serve from an EngineThread (engine/engine_thread.py): manifests prepared as requests finish, releases
        applied on that thread. Call before any hold_kv request is submitted."""
        thread.observers.append(self._observe)
        thread.handlers[ReleaseHeld] = self._apply_release
        self._release = lambda request_id: thread.send([ReleaseHeld(request_id)])

    def _observe(self, outputs: list) -> None:
        """On the engine thread, under its lock, after a step: each held request that finished is prepared for
        offering (its pages' manifest); one that ended at its first token (EOS, a stop) has nothing for a decode
        worker to do and is freed now."""
        held = self.engine.scheduler.held
        for output in outputs:
            if not output.finished or output.request_id not in held:
                continue
            if output.finish_reason != "length":
                self.engine.release_kv(output.request_id)
                continue
            if self._take_doomed(output.request_id):  # its front released it (by name) before it finished
                self.engine.release_kv(output.request_id)
                self.num_released += 1
                continue
            self.prepare(output.request_id, self.engine.offer_kv(output.request_id))

    def _apply_release(self, message: ReleaseHeld) -> bool:
        self.engine.release_kv(message.request_id)
        return True

    def prepare(self, request_id: str, manifest: KVManifest) -> None:
        """A finished hold_kv request's manifest, ready to offer. Its pages are kept a lease's time for the answer
        to go out; past that, nobody is told of them (the client left) and they are freed."""
        with self._mutex:
            self._prepared[request_id] = (manifest, self._clock() + self.lease_seconds)

    def _take_doomed(self, request_id: str) -> bool:
        with self._names_mutex:
            if request_id not in self._doomed:
                return False
            self._doomed.discard(request_id)
            self._forget_locked(request_id)
            return True

    # ------------------------------------------------------------ any thread

    def expect(self, name: str, request_id: str) -> None:
        """A front's `name` for the hold_kv request `request_id`, before it is submitted: release(name) frees its
        pages whenever it comes. A name released already (the front left before this request got here) dooms the
        request: its pages are freed as it finishes."""
        with self._names_mutex:
            if self._released_early.pop(name, None) is not None:
                self._doomed.add(request_id)
            self._by_name[name] = request_id
            self._name_of[request_id] = name

    def settle(self, request_id: str) -> None:
        """The request's HTTP answer is over: forget its name unless its pages are still held (offered or about to
        be) -- those keep it until they are freed."""
        with self._mutex:
            held = request_id in self._leases or request_id in self._prepared
            with self._names_mutex:
                if not held and request_id not in self._doomed:
                    self._forget_locked(request_id)

    def release(self, key: str) -> None:
        """Free a request's pages, by its id here or the name a front gave it, whether they are held now, will be
        (it is still prefilling: freed as it finishes), or the name is not known yet (remembered a lease's time)."""
        with self._mutex:
            with self._names_mutex:
                request_id = self._by_name.get(key, key)
                known = request_id in self._name_of
            if request_id in self._leases or request_id in self._prepared:
                self.drop(request_id)
                return
            with self._names_mutex:
                if known:
                    self._doomed.add(request_id)
                    return
                self._released_early[key] = self._clock() + self.lease_seconds
                self._released_early.move_to_end(key)
                while len(self._released_early) > MAX_EARLY_RELEASES:
                    self._released_early.popitem(last=False)

    def _forget_locked(self, request_id: str) -> None:
        name = self._name_of.pop(request_id, None)
        if name is not None and self._by_name.get(name) == request_id:
            del self._by_name[name]

    @property
    def num_names(self) -> int:
        """Names a front gave requests here that are still remembered (held, in flight, or released early)."""
        return len(self._by_name) + len(self._released_early)

    def offer(self, request_id: str) -> KVManifest:
        """The manifest of a finished hold_kv request (for the decode side), starting its lease now: the clock runs
        from when the decode side is told, however late that is. PagesGone if they are not held any more."""
        with self._mutex:
            prepared = self._prepared.pop(request_id, None)
            if prepared is not None:
                self._leases[request_id] = self._clock() + self.lease_seconds
                return prepared[0]
            if request_id in self._leases:
                raise PagesGone(f"request {request_id!r} was offered already")
        if self._release is not None:
            raise PagesGone(f"the KV pages of request {request_id!r} are gone (held past its lease unoffered, or "
                            f"released by its front)")
        if self._take_doomed(request_id):
            with self._lock:
                self.engine.release_kv(request_id)
            self.num_released += 1
            raise PagesGone(f"request {request_id!r} was released by its front before it finished")
        try:
            with self._lock:
                manifest = self.engine.offer_kv(request_id)
        except KVHandoffError as error:
            raise PagesGone(str(error)) from None
        with self._mutex:
            self._leases[request_id] = self._clock() + self.lease_seconds
        return manifest

    @property
    def num_leased(self) -> int:
        return len(self._leases)

    @property
    def num_prepared(self) -> int:
        return len(self._prepared)

    def handle(self, message: Message) -> tuple[Message | None, list[bytes]]:
        """One message from a decode side; returns the reply (None: none) and its page frames."""
        request_id = message.request_id
        with self._mutex:
            if request_id not in self._leases:
                return Failed(request_id, f"no KV held for request {request_id!r} (never offered, collected, or its "
                                          f"lease lapsed)"), []
            if isinstance(message, Pull):
                if message.layout_digest != self.layout_digest:
                    self.drop(request_id)
                    return Failed(request_id, "KV layouts differ (model, weights, KV dtype, block size or layer "
                                              "groups): this prefill worker and that decode worker cannot share pages",
                                  LAYOUT_MISMATCH), []
                self._leases[request_id] = self._clock() + self.lease_seconds
                try:
                    with nullcontext() if self._release is not None else self._lock:
                        payloads = self.engine.read_kv_pages(request_id, list(message.pages))
                except (KVHandoffError, IndexError) as error:
                    self.drop(request_id)
                    return Failed(request_id, f"cannot read the pages asked for: {error}"), []
                return Pages(request_id, message.pages, tuple(payload_digest(p) for p in payloads)), payloads
            if isinstance(message, KeepAlive):  # a decode side (or a front) still coming for them
                self._leases[request_id] = self._clock() + self.lease_seconds
                return message, []
            if isinstance(message, (Done, Failed)):
                self.drop(request_id)
            return None, []

    def drop(self, request_id: str) -> None:
        """Free a request's pages now (collected, failed, or its client gone before decode)."""
        with self._mutex:
            held = self._leases.pop(request_id, None) is not None or self._prepared.pop(request_id, None) is not None
            if held:
                self._free(request_id)  # inside the mutex: no pull of these pages is reading them now
                self.num_released += 1
            with self._names_mutex:
                self._doomed.discard(request_id)
                self._forget_locked(request_id)

    def _free(self, request_id: str) -> None:
        if self._release is not None:
            self._release(request_id)
            return
        with self._lock:
            self.engine.release_kv(request_id)

    def expire(self) -> list[str]:
        """Free the pages of every lapsed lease, and of held requests never offered (their answer never went out:
        the client left first) once a lease's time has passed since they finished; returns the lapsed leases'
        request ids."""
        now = self._clock()
        with self._mutex:
            lapsed = [request_id for request_id, deadline in self._leases.items() if deadline <= now]
            unoffered = [request_id for request_id, (_, deadline) in self._prepared.items() if deadline <= now]
            for request_id in lapsed + unoffered:
                self.drop(request_id)
            self.num_lapsed += len(lapsed)
        with self._names_mutex:
            while self._released_early and next(iter(self._released_early.values())) <= now:
                self._released_early.popitem(last=False)
        if self._release is None:
            self._expire_unprepared()
        return lapsed

    def _expire_unprepared(self) -> None:
        """Unattached: held requests nobody prepared or offered, a lease's time after they finished."""
        with self._lock:
            never_offered = [request_id for request_id, seq in self.engine.scheduler.held.items()
                             if request_id not in self._leases and request_id not in self._prepared
                             and seq.finish_time is not None
                             and seq.finish_time + self.lease_seconds <= time.monotonic()]
            for request_id in never_offered:
                self.engine.release_kv(request_id)
