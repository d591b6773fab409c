"""The router: models, their replicas, and for each request which model (for `auto`) and which replica.

It keeps the replicas' health (a background probe; a failed request takes a replica out at once), their load
counted at dispatch (load.py), the prefix blocks they hold (affinity.py) and their rates (rates.py), and sends a
request to the best usable replica, failing over to the next while the request has surely not started generating
there (an engine worker: no output yet; an OpenAI server: no connection, or a refusal; a replica that
answered 429/503 is busy: skipped until its Retry-After; when none takes a request, the client gets a 503, or the
busy backend's own 429/503, with Retry-After -- never a 4xx or a 502 for a request that was valid). Once a replica
has produced output for a request -- or an OpenAI server had the request and dropped it before answering, which a
non-streaming request's whole answer does -- a failure ends that request with an explicit error (ReplicaFailed, a
502): it is never silently re-run, and never left waiting.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from ridgeline.cluster.affinity import PrefixIndex, prompt_block_hashes
from ridgeline.cluster.errors import NoReplicaAvailable, ReplicaBusy, ReplicaError, ReplicaFailed, ReplicaRejected
from ridgeline.cluster.health import Health
from ridgeline.cluster.http_replica import HttpReplica
from ridgeline.cluster.load import LoadTracker
from ridgeline.cluster.messages import GenerateRequest
from ridgeline.cluster.metrics import RouterMetrics
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.replica_policy import ReplicaChoice, RoundRobin, rank_replicas
from ridgeline.cluster.replicas import Replica, WorkerReplica
from ridgeline.cluster.cost import DECODE_BATCH_KNEE
from ridgeline.cluster.tier_policy import TierCandidate, TierDecision, calibrate, decide, decide_cheapest, difficulty
from ridgeline.engine.outputs import RequestOutput
from ridgeline.napkin.token_cost import MILLION, usd_per_mtok

logger = logging.getLogger("ridgeline.router")
PASSED_HEADERS = ("retry-after",)  # an OpenAI server's headers passed on to the client (and x-ridgeline-*)


@dataclass
class ModelGroup:
    """One model clients can name: its replicas (all ridgeline workers, or all OpenAI-compatible servers)."""

    name: str
    quality: float
    replicas: list[Replica]
    tokenizer: object | None = None  # ridgeline workers: what the front encodes prompts with
    admission: object | None = None  # ridgeline workers: the engine's Admission, which the front checks requests by
    chars_per_token: float = 4.0
    notes: list[str] = field(default_factory=list)

    @property
    def max_model_len(self) -> int | None:
        return self.admission.max_seq_len if self.admission is not None else None

    @property
    def is_http(self) -> bool:
        return isinstance(self.replicas[0], HttpReplica)


@dataclass
class Forwarded:
    """An OpenAI server's response on its way through: status and headers now, body as it arrives."""

    status: int
    content_type: str
    body: AsyncIterator[bytes]
    replica: str
    headers: dict[str, str] = field(default_factory=dict)  # the backend's Retry-After and x-ridgeline-* headers


# A prompt's length: one figure for every model, or each model's own (model -> tokens).
PromptTokens = int | Mapping[str, int]
# Of a longer prompt, `auto` tokenizes this many characters and scales the count to the rest (count_prompt_tokens).
COUNT_CHARS = 32_768


class Router:
    def __init__(self, groups: list[ModelGroup], rates: dict[str, Rates], threshold: float = 0.05,
                 expected_output_tokens: int = 128, health_interval_s: float = 1.0, policy: str = "cost",
                 learn_rates: bool = True, prices: dict[str, float] | None = None, objective: str = "quality",
                 slo_ttft_s: float | None = None, slo_itl_s: float | None = None):
        if policy not in ("cost", "round_robin"):
            raise ValueError(f"unknown replica policy {policy!r} (cost or round_robin)")
        if objective not in ("quality", "cost"):
            raise ValueError(f"unknown objective {objective!r} (quality or cost)")
        for group in groups:
            if len({isinstance(r, HttpReplica) for r in group.replicas}) != 1:
                raise ValueError(f"model {group.name!r} mixes ridgeline workers and OpenAI servers")
        self.groups = {g.name: g for g in groups}
        self.replicas = {r.name: r for g in groups for r in g.replicas}
        # Replicas of one model and kind share one estimate, pooled from all their requests: per-replica estimates
        # let one slow measurement brand a replica slow, and a replica the router then avoids is never re-measured.
        self.rates = {}
        for group in groups:
            pooled: dict[str, Rates] = {}
            for replica in group.replicas:
                self.rates[replica.name] = pooled.setdefault(replica.kind, rates[replica.name])
        self.threshold = threshold
        self.expected_output_tokens = expected_output_tokens
        self.health_interval_s = health_interval_s
        self.health = {name: Health() for name in self.replicas}
        self.loads = LoadTracker()
        self.index = PrefixIndex()
        self.metrics = RouterMetrics()
        self.round_robin = RoundRobin() if policy == "round_robin" else None
        self.learn_rates = learn_rates  # False: keep the given rates (a pinned config, or reproducible tests)
        self.prices = dict(prices or {})  # replica -> US dollars per hour of its machine (absent: not priced)
        self.objective, self.slo_ttft_s, self.slo_itl_s = objective, slo_ttft_s, slo_itl_s
        if objective == "cost":
            unpriced = sorted(name for name in self.replicas if name not in self.prices)
            if unpriced:
                raise ValueError(f"the cost objective needs a price for every replica; none for {', '.join(unpriced)}")
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle and health

    async def start(self) -> None:
        await self.probe_all()
        self._task = asyncio.create_task(self._health_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(r.close() for r in self.replicas.values()), return_exceptions=True)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.probe_all()

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(name) for name in self.replicas))

    async def probe(self, name: str) -> None:
        replica, health = self.replicas[name], self.health[name]
        try:
            status = await replica.probe()
        except ReplicaBusy as error:
            health.busy(error.retry_after)
        except (ReplicaError, Exception) as error:  # noqa: BLE001 - any failed probe takes the replica out
            self._take_out(name, f"health check: {error}")
        else:
            if health.passed():
                logger.info(json.dumps({"event": "replica_rejoined", "replica": name}))
            if status is not None:
                self.index.apply(name, status.cache_events)
                self.loads.report(name, status.prefill_remaining)
                self.metrics.cached_blocks.labels(name).set(self.index.num_blocks(name))
        self._update_gauges(name)

    def _take_out(self, name: str, reason: str) -> None:
        health = self.health[name]
        if health.up:
            logger.warning(json.dumps({"event": "replica_down", "replica": name, "reason": reason}))
        health.failed(reason)
        self.index.forget(name)  # a restarted worker starts cold

    def _update_gauges(self, name: str) -> None:
        load = self.loads.of(name)
        self.metrics.replica_up.labels(name).set(1 if self.health[name].up else 0)
        self.metrics.in_flight.labels(name).set(load.num_in_flight)
        self.metrics.backlog.labels(name).set(load.prefill_backlog)
        prices = self.usd_per_mtok(name)
        if prices is not None:
            self.metrics.usd_per_mtok.labels(name, "prompt").set(prices[0])
            self.metrics.usd_per_mtok.labels(name, "completion").set(prices[1])

    def usd_per_mtok(self, name: str) -> tuple[float, float] | None:
        """(prompt, completion) US dollars per million tokens on replica `name` at its price and current rates: a
        prompt token at its prefill rate, a completion token at the decode rate of all the streams it counts in
        flight (one at least; per-stream speed falls as the batch grows, as cost.py predicts). None: no price."""
        if name not in self.prices:
            return None
        rates, streams = self.rates[name], max(1, self.loads.of(name).num_in_flight)
        decode_total = streams * rates.decode_tokens_per_s / (1 + (streams - 1) / DECODE_BATCH_KNEE)
        price = self.prices[name]
        return usd_per_mtok(price, rates.prefill_tokens_per_s), usd_per_mtok(price, decode_total)

    # ------------------------------------------------------------ decisions

    def model_names(self) -> list[str]:
        return list(self.groups)

    def group(self, model: str) -> ModelGroup:
        return self.groups[model]

    def usable(self, model: str) -> list[str]:
        now = time.monotonic()
        return [r.name for r in self.groups[model].replicas if self.health[r.name].usable(now)]

    def retry_after(self, model: str) -> float | None:
        """Seconds until the soonest of `model`'s busy replicas is usable again (None: none is busy, or none up)."""
        now = time.monotonic()
        waits = [self.health[r.name].busy_until - now for r in self.groups[model].replicas
                 if self.health[r.name].up and self.health[r.name].busy_until > now]
        return min(waits) if waits else None

    def _none_took(self, model: str, refusals: list[str], busy: list[ReplicaBusy]) -> NoReplicaAvailable:
        """What a client is told when no replica of `model` took its request: the busy backend's own refusal that
        ends soonest (status, body, Retry-After) if one refused it, else a 503 with the soonest Retry-After."""
        soonest = min(busy, key=lambda b: b.retry_after if b.retry_after is not None else 1.0, default=None)
        retry_after = soonest.retry_after if soonest is not None else self.retry_after(model)
        refused = NoReplicaAvailable(f"no replica of {model!r} could take the request"
                                  + (f" ({'; '.join(refusals)})" if refusals else
                                     " (all busy)" if retry_after is not None else " (none is up)"),
                                  retry_after, soonest)
        self.metrics.refusals.labels(model, str(refused.status)).inc()
        return refused

    def rank(self, model: str, prompt_tokens: int, output_tokens: int | None = None,
             prompt_ids: list[int] | None = None) -> list[ReplicaChoice]:
        """Usable replicas of `model`, best first, with the prompt blocks each holds and its predicted cost."""
        usable = self.usable(model)
        cached: dict[str, int] = {}
        caches: dict[str, tuple[int, int]] = {}  # replica -> (block size, prompt blocks its cache holds)
        if prompt_ids is not None:
            by_size: dict[int, list[str]] = {}
            for name in usable:
                replica = self.replicas[name]
                if isinstance(replica, WorkerReplica) and replica.info is not None:
                    by_size.setdefault(replica.info.block_size, []).append(name)
                    if replica.info.cache_blocks is not None:
                        caches[name] = (replica.info.block_size, replica.info.cache_blocks)
            for size, names in by_size.items():
                cached.update(self.index.match(names, prompt_ids, size))
        ranked = rank_replicas(usable, prompt_tokens, output_tokens or self.expected_output_tokens, cached,
                               self.index, self.loads, self.rates, caches)
        return self.round_robin.order(model, ranked) if self.round_robin else ranked

    def count_prompt_tokens(self, text: str) -> dict[str, int]:
        """The prompt's length in each model's own tokens: counted with its tokenizer where the router holds one
        (its ridgeline models), else estimated at the model's configured characters per token (OpenAI servers).
        Text past COUNT_CHARS is not tokenized: it is counted at the characters per token of what was (this runs on
        the event loop, at about 0.4 us a character)."""
        counted: dict[int, int] = {}  # by tokenizer: tiers of one family share the count
        lengths = {}
        for name, group in self.groups.items():
            tokenizer = group.tokenizer
            if tokenizer is None:
                lengths[name] = max(1, round(len(text) / group.chars_per_token))
                continue
            if id(tokenizer) not in counted:
                head = text[:COUNT_CHARS]
                tokens = len(tokenizer.encode(head, add_bos=False))
                if len(text) > len(head):
                    tokens = round(tokens * len(text) / len(head))
                counted[id(tokenizer)] = max(1, tokens)
            lengths[name] = counted[id(tokenizer)]
        return lengths

    def _length_for_difficulty(self, prompt_tokens: PromptTokens) -> int:
        """One length for the prompt's difficulty: the first model's (in the router's order) whose tokenizer counted
        it, else the first estimate."""
        if isinstance(prompt_tokens, int):
            return prompt_tokens
        held = [prompt_tokens[name] for name, g in self.groups.items() if g.tokenizer is not None and name in prompt_tokens]
        return (held or list(prompt_tokens.values()) or [1])[0]

    def candidates(self, prompt_tokens: PromptTokens, output_tokens: int | None = None) -> list[TierCandidate]:
        """`prompt_tokens`: one length for every model, or each model's own (count_prompt_tokens)."""
        found = []
        output_tokens = output_tokens or self.expected_output_tokens
        for name, group in self.groups.items():
            length = prompt_tokens if isinstance(prompt_tokens, int) else prompt_tokens[name]
            ranked = self.rank(name, length, output_tokens)
            if ranked:
                best = ranked[0]
                prices = self.usd_per_mtok(best.replica)
                usd = None
                if prices is not None:  # this request's tokens at the replica's per-token prices
                    usd = ((length - best.cached_tokens) * prices[0] + output_tokens * prices[1]) / MILLION
                found.append(TierCandidate(name, group.quality, best.cost.total_s, best.replica, usd,
                                           best.cost.queue_s + best.cost.prefill_s,
                                           best.cost.decode_s / max(1, output_tokens)))
        return found

    def decide_auto(self, prompt_tokens: PromptTokens, output_tokens: int | None = None,
                    text: str | None = None) -> TierDecision:
        """Which model serves an `auto` request; logged and counted. Raises NoReplicaAvailable if none can.
        `prompt_tokens`: the whole prompt's length (one for all models, or each model's own); `text`: what the user
        asks now (the last user turn), scanned for what makes a question hard."""
        started = time.perf_counter()
        candidates = self.candidates(prompt_tokens, output_tokens)
        if not candidates:
            raise NoReplicaAvailable("no model has a usable replica")
        hardness = difficulty(self._length_for_difficulty(prompt_tokens), text)
        if self.objective == "cost":
            decision = decide_cheapest(candidates, hardness, self.slo_ttft_s, self.slo_itl_s)
        else:
            decision = decide(candidates, hardness, self.threshold)
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        self.metrics.decisions.labels(decision.model, decision.kind).inc()
        if logger.isEnabledFor(logging.INFO):
            logger.info(json.dumps({"event": "auto", "prompt_tokens": prompt_tokens, **decision.as_log()}))
        return decision

    def calibrate(self, sample: list[tuple[PromptTokens, str | None]], target_share: float,
                  output_tokens: int | None = None) -> float:
        """Set the threshold that sends target_share of the sample (prompt tokens, text) to the best model, at the
        costs predicted now (calibrate idle, so load later shifts traffic to the cheaper tiers)."""
        points = [(difficulty(self._length_for_difficulty(tokens), text), self.candidates(tokens, output_tokens))
                  for tokens, text in sample]
        self.threshold = calibrate([p for p in points if p[1]], target_share)
        return self.threshold

    # ------------------------------------------------------------ dispatch

    def _dispatch(self, model: str, name: str, request_id: str, choice: ReplicaChoice, prompt_tokens: int) -> None:
        self.loads.dispatched(name, request_id, max(0, prompt_tokens - choice.cached_tokens))
        self.metrics.prompt_tokens.labels(name).inc(prompt_tokens)
        self.metrics.affinity_tokens.labels(name).inc(choice.cached_tokens)
        self._update_gauges(name)

    def _finish(self, model: str, name: str, request_id: str, outcome: str) -> None:
        self.loads.done(name, request_id)
        self.index.ended(request_id)
        self.metrics.requests.labels(model, name, outcome).inc()
        self._update_gauges(name)

    def _observe(self, model: str, name: str, output: RequestOutput) -> None:
        if self.learn_rates:
            self.rates[name].observe_output(output)

    def _on_refused(self, model: str, name: str, error: ReplicaError) -> None:
        if isinstance(error, ReplicaBusy):
            self.health[name].busy(error.retry_after)
        else:
            self._take_out(name, str(error))
        self.metrics.failovers.labels(model, name).inc()

    async def generate(self, model: str, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """The request's outputs from the best replica of a ridgeline model, failing over while none has come."""
        prompt_tokens = len(request.prompt_token_ids)
        ranked = self.rank(model, prompt_tokens, request.params.max_tokens, request.prompt_token_ids)
        refusals, busy = [], []
        for choice in ranked:
            name = choice.replica
            replica = self.replicas[name]
            self._dispatch(model, name, request.request_id, choice, prompt_tokens)
            if isinstance(replica, WorkerReplica) and replica.info is not None:
                self.index.expect(name, request.request_id,
                                  prompt_block_hashes(request.prompt_token_ids, replica.info.block_size))
            started, outcome = False, "cancelled"
            try:
                async with contextlib.aclosing(replica.generate(request)) as outputs:
                    async for output in outputs:
                        if not started:
                            started = True
                            self.loads.first_token(name, request.request_id)
                        if output.finished:
                            outcome = "ok"
                            if output.finish_reason != "abort":
                                self._observe(model, name, output)
                        yield output
                return
            except ReplicaRejected:
                outcome = "rejected"
                raise
            except ReplicaError as error:
                if started:  # output already went out: the request fails, explicitly, and is not re-run
                    outcome = "failed"
                    self._take_out(name, str(error))
                    raise
                self._on_refused(model, name, error)
                outcome = "failed_over"
                refusals.append(f"{name}: {error}")
                if isinstance(error, ReplicaBusy):
                    busy.append(error)
            finally:
                self._finish(model, name, request.request_id, outcome)
        raise self._none_took(model, refusals, busy)

    async def forward(self, model: str, path: str, body: dict, prompt_tokens: int, request_id: str,
                      headers: dict[str, str] | None = None) -> Forwarded:
        """Send an OpenAI request body to the best replica of an OpenAI-server model, failing over while none has
        answered. Only a request the replica surely never started goes to another (no connection, a 429/503); one
        it had and dropped before answering is a 502 (ReplicaFailed), not run twice. The body streams through; a
        connection cut part-way ends it with an error event. `headers` go with it (what is left of the request's
        deadline). Cancelled (its client left) before the replica answered: the connection to it closes, which the
        replica aborts on."""
        refusals, busy = [], []
        for choice in self.rank(model, prompt_tokens, body.get("max_tokens")):
            name = choice.replica
            replica: HttpReplica = self.replicas[name]
            self._dispatch(model, name, request_id, choice, prompt_tokens)
            try:
                response = await replica.open(path, body, headers)
            except asyncio.CancelledError:
                self._finish(model, name, request_id, "cancelled")
                raise
            except ReplicaFailed as error:  # it had the request and may have run it: not re-run elsewhere
                self._finish(model, name, request_id, "failed")
                self._take_out(name, str(error))
                raise
            except ReplicaError as error:
                self._finish(model, name, request_id, "failed_over")
                self._on_refused(model, name, error)
                refusals.append(f"{name}: {error}")
                if isinstance(error, ReplicaBusy):
                    busy.append(error)
                continue
            passed = {k: v for k, v in response.headers.items() if k.lower() in PASSED_HEADERS
                      or k.lower().startswith("x-ridgeline-")}
            return Forwarded(response.status_code, response.headers.get("content-type", "application/json"),
                             self._relay(model, name, replica, response, request_id), name, passed)
        raise self._none_took(model, refusals, busy)

    async def _relay(self, model: str, name: str, replica: HttpReplica, response, request_id: str) -> AsyncIterator[bytes]:
        outcome = "cancelled"
        try:
            first = True
            async for chunk in replica.relay(response):
                if first:
                    first = False
                    self.loads.first_token(name, request_id)
                yield chunk
            outcome = "ok" if response.status_code < 400 else "error"
        except ReplicaFailed as error:
            outcome = "failed"
            self._take_out(name, str(error))
            streaming = "text/event-stream" in response.headers.get("content-type", "")
            message = json.dumps({"error": {"message": str(error), "type": "server_error", "param": None,
                                            "code": ReplicaFailed.code}})
            yield (f"data: {message}\n\ndata: [DONE]\n\n" if streaming else message).encode()
        finally:
            self._finish(model, name, request_id, outcome)

