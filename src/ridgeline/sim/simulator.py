"""The discrete-event loop: arrivals, steps of every replica and KV transfers, in virtual time.

Events at the same instant run in this order: steps end (tokens land), then arrivals and KV transfers join
the replicas' queues, then replicas start their next steps; so a request arriving exactly as a step ends
is scheduled in the next step, as in the server. Colocated: every replica prefills and decodes, and a request
goes to the one with the fewest outstanding requests. Disaggregated, as `serve --role prefill|decode` runs it:
the prefill pool computes each prompt and its first token and holds the pages; the offer reaches the least
loaded decode replica after the link's latency; at its next step boundary that replica reserves pages
(Scheduler.reserve_prefilled, prefix hits there skip their blocks); the missing KV then crosses the link, the
replica admits the sequence at the boundary after it lands (admit_prefilled), and the prefill side frees its
held pages.
"""

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.engine.sequence import Sequence
from ridgeline.errors import RidgelineError
from ridgeline.napkin.model_shape import ModelShape
from ridgeline.sim.kv_pool import KVPool
from ridgeline.sim.link import Link
from ridgeline.sim.replica import Replica, request_params
from ridgeline.sim.step_time import StepTimeModel, TermsOf
from ridgeline.sim.workload import SimRequest, Workload

STEP_END, ARRIVE, KV_OFFER, KV_LANDS, START = 0, 1, 1, 1, 2  # same-instant order (see the module docstring)


@dataclass
class Track:
    """One request's life across replicas, in virtual seconds."""

    request: SimRequest
    index: int
    prefill: "Replica | None" = None  # disaggregated: where the prompt's pages are held until collected
    prefill_id: str = ""
    sent_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_s: float | None = None
    error: str = ""
    num_cached_tokens: int = 0


@dataclass(frozen=True)
class Deployment:
    """What serves: a shape with its KV pool and scheduler settings on `replicas` engines, or a P:D split."""

    shape: ModelShape
    pool: KVPool
    scheduler: SchedulerConfig
    step_time: StepTimeModel
    kv_dtype_bytes: float = 2
    replicas: int = 1
    disaggregate: tuple[int, int] | None = None  # (prefill replicas, decode replicas)
    link: Link = Link()
    jitter_seed: int = 0  # seeds each replica's draws of a calibrated model's measured step jitter

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise RidgelineError(f"--replicas must be at least 1, got {self.replicas}")
        if self.disaggregate is not None and min(self.disaggregate) < 1:
            raise RidgelineError(f"--disaggregate P:D needs at least one replica on each side, got {self.disaggregate}")


@dataclass
class SimResult:
    tracks: list[Track]
    replicas: list[Replica]
    duration_s: float
    events: int


class Simulation:
    def __init__(self, deployment: Deployment, workload: Workload, log_steps: bool = False):
        self.deployment, self.workload = deployment, workload
        terms_of = TermsOf(deployment.shape, deployment.kv_dtype_bytes, deployment.step_time.path)
        shape = deployment.shape

        def make(name: str, config: SchedulerConfig, role: str) -> Replica:
            return Replica(name, config, deployment.pool, shape.max_context, shape.vocab_size, deployment.step_time,
                           terms_of, log_steps, role, seed=deployment.jitter_seed)

        if deployment.disaggregate is None:
            self.entry = [make(f"r{i}", deployment.scheduler, "colocated") for i in range(deployment.replicas)]
            self.decode: list[Replica] = []
        else:
            num_prefill, num_decode = deployment.disaggregate
            self.entry = [make(f"p{i}", deployment.scheduler, "prefill") for i in range(num_prefill)]
            self.decode = [make(f"d{i}", deployment.scheduler, "decode") for i in range(num_decode)]
        self.tracks = [Track(request, i) for i, request in enumerate(workload.requests)]
        self._events: list = []
        self._order = itertools.count()
        self._gate: deque[Track] = deque()  # arrived, waiting for a concurrency slot
        self._in_flight = 0
        self._by_seq: dict[str, Track] = {}
        self._terms = terms_of

    def run(self) -> SimResult:
        for track in self.tracks:
            self._push(track.request.arrival_s, ARRIVE, track)
        events = 0
        end = 0.0
        while self._events:
            now, kind, _, payload = heapq.heappop(self._events)
            events += 1
            end = now
            if kind == STEP_END:
                replica = payload
                for seq in replica.finish_step(now):
                    self._finished(replica, seq, now)
                self._queue_start(replica, now)
            elif kind == START:
                replica = payload
                replica.start_queued = False
                step_end = replica.start_step(now)
                for seq in replica.reserved:  # pages reserved: the KV the decode side lacks crosses the link
                    self._push(now + self._transfer_s(seq), KV_LANDS, (replica, seq))
                replica.reserved.clear()
                if step_end is not None:
                    self._push(step_end, STEP_END, replica)
            elif isinstance(payload, Track):  # ARRIVE
                self._gate.append(payload)
                self._admit(now)
            elif isinstance(payload, Sequence):  # KV_OFFER: a prefilled sequence for the decode pool
                replica = min(self.decode, key=lambda r: r.outstanding)
                replica.offers.append(payload)
                self._queue_start(replica, now)
            else:  # KV_LANDS: every page arrived; the prefill side lets go of its copy
                replica, seq = payload
                replica.landed.append(seq)
                track = self._by_seq[seq.request_id]
                track.prefill.scheduler.release_held(track.prefill_id)
                self._queue_start(replica, now)
        return SimResult(self.tracks, self.entry + self.decode, end, events)

    def _push(self, when: float, kind: int, payload: object) -> None:
        heapq.heappush(self._events, (when, kind, next(self._order), payload))

    def _queue_start(self, replica: Replica, now: float) -> None:
        if not replica.busy and not replica.start_queued:
            replica.start_queued = True
            self._push(now, START, replica)

    def _admit(self, now: float) -> None:
        cap = self.workload.concurrency
        while self._gate and (cap is None or self._in_flight < cap):
            track = self._gate.popleft()
            self._in_flight += 1
            track.sent_s = now
            request = track.request
            output = 1 if self.decode else request.output_tokens
            replica = min(self.entry, key=lambda r: r.outstanding)
            try:
                seq = replica.add(f"req-{track.index}", request.prompt_ids, output, now, hold_kv=bool(self.decode))
            except RidgelineError as error:  # the server answers such a request with a 400
                track.error, track.finish_s = str(error), now
                self._in_flight -= 1
                continue
            self._by_seq[seq.request_id] = track
            self._queue_start(replica, now)

    def _finished(self, replica: Replica, seq: Sequence, now: float) -> None:
        track = self._by_seq.pop(seq.request_id)
        track.token_times.extend(seq.token_times)
        if replica in self.entry:
            track.num_cached_tokens = seq.num_cached_tokens
        if replica.role == "prefill":
            track.prefill, track.prefill_id = replica, seq.request_id
            if track.request.output_tokens > 1:
                # As the decode engine's receive_kv builds it: the prompt plus the first token sampled over there.
                rest = Sequence(f"{seq.request_id}/decode", list(seq.prompt_token_ids),
                                request_params(track.request.output_tokens), now)
                rest.append_token(seq.output_token_ids[0], seq.token_times[0])
                rest.token_times.clear()  # the first token's time is already the track's
                self._by_seq[rest.request_id] = track
                self._push(now + self.deployment.link.latency_s, KV_OFFER, rest)
                return
            replica.scheduler.release_held(seq.request_id)
        track.finish_s = now
        self._in_flight -= 1
        self._admit(now)


    def _transfer_s(self, seq: Sequence) -> float:
        """The KV the decode side did not find in its own prefix cache, over the link (sliding-window layers
        send only their window: kv_bytes_for_context is window-aware)."""
        shape, kvb = self.deployment.shape, self.deployment.kv_dtype_bytes
        prompt = seq.num_prompt_tokens
        missing = shape.kv_bytes_for_context(prompt, kvb) * (prompt - seq.num_computed_tokens) / prompt
        return self.deployment.link.seconds(missing)


def simulate(deployment: Deployment, workload: Workload, log_steps: bool = False) -> SimResult:
    return Simulation(deployment, workload, log_steps).run()
