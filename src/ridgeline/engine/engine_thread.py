"""One `LLMEngine` stepped by its own thread and driven from any other through typed messages (engine/messages.py).

The one driver under every front: the one-model server (server/async_engine.py hands the outputs to asyncio) and
the router's workers (cluster/worker.py, in this process or inside a Ray actor). The engine is not thread-safe, so
only this thread touches it, always holding `engine_lock` (also taken by anything else that must read the engine,
e.g. a prefill worker's KV source): adds and aborts are queued and applied between steps, and every step's outputs
go to the sink their request was submitted with.

    driver = EngineThread(engine, "ridgeline-engine").start()
    driver.submit([(AddRequest(...), sink)])   # sink(item) gets each RequestOutput (the last one .finished), or one
                                               # exception: RidgelineError (the request is at fault), EngineDeadError
                                               # (the engine is gone), or what a message handler failed it with
    driver.abort(request_id)                   # pages freed before the next step; the sink gets a final "abort"
    driver.stop() / driver.kill(reason)        # stop: after what is queued; kill: every request fails at once

Sinks run where `deliver` runs them: by default on the engine thread, one step's batch at a time (an asyncio front
passes a `deliver` that hops to its event loop once per step instead of once per token).
"""

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ridgeline.engine.messages import AbortRequest, AddRequest, EngineMessage
from ridgeline.engine.outputs import RequestOutput
from ridgeline.errors import RidgelineError

Sink = Callable[[RequestOutput | BaseException], None]
Delivery = tuple[Sink, RequestOutput | BaseException]
# A handler for a message kind the driver does not know (a decode worker's ReceiveKV): runs on the engine thread
# under engine_lock; False means "not now" (no free pages yet), and the message is offered again after the next step.
Handler = Callable[[object], bool]
# Runs on the engine thread under engine_lock after every step, with that step's outputs.
StepObserver = Callable[[list[RequestOutput]], None]

RETRY_SECONDS = 0.01  # how soon an idle engine offers a deferred message again


class EngineDeadError(RuntimeError):
    """The engine thread failed or was stopped; every request in flight fails with it."""


class EngineRefused(Exception):
    """submit() took nothing: the engine is not running (`full` False) or has `capacity` requests in flight."""

    def __init__(self, message: str, full: bool):
        super().__init__(message)
        self.full = full


@dataclass
class Backlog:
    """What the engine has been given and not yet done, read in one piece (a router's load correction)."""

    received: int  # requests submitted over the driver's life: which dispatches this snapshot covers
    num_running: int
    num_waiting: int
    queued_prefill_tokens: int  # prompt tokens submitted and not yet computed (queued messages included)
    # Per request in flight, as of the last step: prompt tokens it still has to prefill, a waiting prompt's cached
    # prefix left out (None: still queued for the engine, not yet looked at). Only with detailed_backlog.
    prefill_remaining: dict[str, int | None] | None = None


class EngineThread:
    def __init__(self, engine, name: str = "ridgeline-engine", *, capacity: int | None = None,
                 deliver: Callable[[list[Delivery]], None] | None = None,
                 observers: Iterable[StepObserver] = (), handlers: Mapping[type, Handler] | None = None,
                 detailed_backlog: bool = False):
        self.engine = engine
        # Whether backlog() breaks the prefill backlog down per request (a router's workers: their router corrects
        # its own count of each request with it); costs a prefix-cache lookup per waiting prompt per step.
        self.detailed_backlog = detailed_backlog
        self._remaining: dict[str, int] = {}
        self.engine_lock = threading.Lock()
        self.capacity = capacity  # requests in flight (submitted, not yet finished) beyond which submit refuses
        self._deliver = deliver or run_sinks
        self.observers = list(observers)
        self.handlers = dict(handlers or {})
        self._wake = threading.Condition()  # guards everything below, never held around an engine call
        self._inbox: list[object] = []
        self._deferred: list[object] = []  # only touched on the engine thread
        self._sinks: dict[str, Sink] = {}
        self._received = 0
        self._queued_tokens = 0  # prompt tokens of AddRequests still in the inbox
        self._uncomputed_tokens = 0  # prompt tokens the scheduler had not computed after the last step
        self._stop = False
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ------------------------------------------------------------ any thread

    def start(self) -> "EngineThread":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive() and not self._stop

    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    def submit(self, routed: list[tuple[EngineMessage, Sink]]) -> None:
        """Queue all of these requests, or none (EngineRefused; RidgelineError for an id already in flight): one
        HTTP request's n choices go in together."""
        with self._wake:
            if not self.alive:
                raise EngineRefused(f"engine is not running ({self.error or 'stopped'})", full=False)
            if self.capacity is not None and len(self._sinks) + len(routed) > self.capacity:
                raise EngineRefused(f"at capacity ({self.capacity} requests in flight)", full=True)
            ids = [message.request_id for message, _ in routed]
            clash = next((i for n, i in enumerate(ids) if i in self._sinks or i in ids[:n]), None)
            if clash is not None:  # its outputs could not be told from the other's
                raise RidgelineError(f"request id {clash!r} is already in flight")
            for message, sink in routed:
                self._sinks[message.request_id] = sink
                if isinstance(message, AddRequest):
                    self._queued_tokens += len(message.request.prompt_token_ids)
                self._inbox.append(message)
            self._received += len(routed)
            self._wake.notify()

    def abort(self, request_id: str) -> None:
        self.send([AbortRequest(request_id)])

    def send(self, messages: list[object]) -> None:
        """Queue messages for the engine thread (aborts; a handler's own messages from its helper threads)."""
        with self._wake:
            self._inbox.extend(messages)
            self._wake.notify()

    def backlog(self) -> Backlog:
        with self._wake:
            scheduler = self.engine.scheduler
            remaining = None
            if self.detailed_backlog:
                remaining = dict[str, int | None](self._remaining)
                remaining.update((m.request_id, None) for m in self._inbox if isinstance(m, AddRequest))
            return Backlog(self._received, scheduler.num_running, scheduler.num_waiting,
                           self._uncomputed_tokens + self._queued_tokens, remaining)

    def stop(self) -> None:
        """Apply what is queued (the aborts of a shutdown free their pages), then end the thread; whatever is still
        in flight fails with EngineDeadError rather than waiting forever."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        self._fail_all("engine stopped")

    def kill(self, reason: str = "killed") -> None:
        """The engine is gone: every request in flight fails now with `reason`, and new ones are refused."""
        with self._wake:
            self.error = reason
            self._stop = True
            self._wake.notify()
        self._fail_all(reason)

    def fail(self, request_id: str, error: BaseException) -> None:
        """End one request with `error` instead of outputs (its pages are the caller's to free)."""
        with self._wake:
            sink = self._sinks.pop(request_id, None)
        if sink is not None:
            self._deliver([(sink, error)])

    def drop_waiting(self, request_id: str) -> None:
        """On the engine thread: forget the request's message still waiting for room (a decode worker's ReceiveKV),
        as an abort or a failure of the request must."""
        self._deferred = [waiting for waiting in self._deferred if getattr(waiting, "request_id", None) != request_id]

    def _fail_all(self, reason: str) -> None:
        with self._wake:
            sinks, self._sinks = self._sinks, {}
        if sinks:
            self._deliver([(sink, EngineDeadError(reason)) for sink in sinks.values()])

    # ------------------------------------------------------------ engine thread

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                with self._wake:
                    while not self._inbox and not self._stop and not engine.has_work():
                        engine.steps.idle()  # the next step's cycle starts after a wait, not at the last step
                        if self._deferred:  # waiting for free pages: look again soon
                            self._wake.wait(RETRY_SECONDS)
                            break
                        self._wake.wait()
                    messages, self._inbox = self._inbox, []
                    stopping = self._stop
                if self.error is not None:  # killed: the engine is treated as lost, nothing more is applied
                    return
                with self.engine_lock:
                    with self._wake:  # what came while the lock was held elsewhere: an abort of a request in
                        messages += self._inbox  # `messages` is applied before the step that would compute it
                        self._inbox = []
                    retry, self._deferred = self._deferred, []
                    for message in retry + messages:
                        self._apply(message)
                    if stopping:  # after the queued aborts, so their pages are back in the pool
                        return
                    outputs = engine.step() if engine.has_work() else []
                    uncomputed = _uncomputed_prompt_tokens(engine.scheduler)
                    remaining = _prefill_remaining(engine.scheduler) if self.detailed_backlog else None
                    for observe in self.observers:
                        observe(outputs)
                with self._wake:
                    self._uncomputed_tokens = uncomputed
                    if remaining is not None:
                        self._remaining = remaining
                    deliveries = []
                    for output in outputs:
                        sink = self._sinks.get(output.request_id)
                        if sink is not None:  # None: failed or killed already
                            deliveries.append((sink, output))
                            if output.finished:
                                del self._sinks[output.request_id]
                if deliveries:
                    self._deliver(deliveries)
        except BaseException as error:  # noqa: BLE001 - whatever broke the engine must reach every waiting request
            self.kill(f"engine failed: {error!r}")
            raise

    def _apply(self, message: object) -> None:
        if isinstance(message, AddRequest):
            with self._wake:
                self._queued_tokens -= len(message.request.prompt_token_ids)
            try:
                self.engine.add_admitted(message.request_id, message.request, message.arrival_time, message.fork_of,
                                         message.hold_kv)
            except RidgelineError as error:  # the request is at fault, not the engine: fail it alone
                self.fail(message.request_id, error)
        elif isinstance(message, AbortRequest):
            self.engine.abort(message.request_id)  # frees its pages now; its "abort" output comes from the next step
            self.drop_waiting(message.request_id)
            if AbortRequest in self.handlers:  # a handler keeping state for requests that wait may want to know
                self.handlers[AbortRequest](message)
        else:
            handler = self.handlers.get(type(message))
            if handler is None:
                raise TypeError(f"no handler for {type(message).__name__} on this engine thread")
            if not handler(message):
                self._deferred.append(message)


def _uncomputed_prompt_tokens(scheduler) -> int:
    return sum(max(0, seq.num_prompt_tokens - seq.num_computed_tokens)
               for queue in (scheduler.waiting, scheduler.running) for seq in queue)


def _prefill_remaining(scheduler) -> dict[str, int]:
    """Prompt tokens each waiting or running sequence still has to prefill; for a prompt not yet started, what its
    prefix cache lookup would leave (a prompt whose prefix is cached costs only the rest), and less the blocks a
    sequence ahead of it is still computing for the same prefix.

    That last part is what the router's load count needs from this (cluster/load.py: the router takes this figure
    for each request it names). Two turns on one new system prompt sent together: the second waits in `waiting`
    while the first prefills it (scheduler._prefix_in_flight), and then finds it cached, so it costs its own turn
    only. Counting only what is cached *now* reported its whole prompt instead, for as long as the first was
    still computing; the router, which had counted it right (the prefix expected there), took the report's ~300
    tokens, and saw the replica holding the prefix as that much busier: enough, with one more prefill queued
    there, to send the next turn on that prefix to the other replica and prefill the prefix a second time (the copy
    the replica policy charges for). Ahead means running, then earlier in `waiting`: the order the scheduler admits
    in, and a later arrival on a prefix in flight waits for it however far back it is."""
    manager = scheduler.block_manager
    if manager.prefix_cache is None or not any(_unstarted(seq) for seq in scheduler.waiting):
        # Nothing to look up (a decode-only step, the common one: this runs after every step on a worker): no
        # hashing, each sequence's own remainder.
        return {seq.request_id: max(0, seq.num_prompt_tokens - seq.num_computed_tokens)
                for queue in (scheduler.running, scheduler.waiting) for seq in queue}
    coming: set[bytes] = set()  # prompt blocks a sequence ahead computes (or holds), by chain hash
    remaining = {}
    for queue in (scheduler.running, scheduler.waiting):
        for seq in queue:
            left = max(0, seq.num_prompt_tokens - seq.num_computed_tokens)
            hashes = manager.block_hashes(seq, (seq.num_prompt_tokens - 1) // manager.block_size)
            if left and _unstarted(seq):
                cached = manager.find_cached_prefix(seq)
                hit = len(cached[0]) if cached else 0
                if seq.sampling_params.prompt_logprobs is None:  # such a request waits for nobody (the scheduler's rule)
                    while hit < len(hashes) and hashes[hit] in coming:
                        hit += 1
                left -= hit * manager.block_size
            coming.update(hashes)
            remaining[seq.request_id] = max(0, left)
    return remaining


def _unstarted(seq) -> bool:
    """No token of its prompt computed and no page taken: its prefix cache lookup is still to come."""
    return seq.num_computed_tokens == 0 and not any(seq.block_tables)


def run_sinks(deliveries: list[Delivery]) -> None:
    for sink, item in deliveries:
        sink(item)
