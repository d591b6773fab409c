"""Prometheus metrics of one server: latency histograms per request, engine gauges per step, token counters.

Each server owns its own `CollectorRegistry` (not prometheus-client's global one) so that several servers
can live in one process, as they do in the tests.

Several API processes over one engine core (`serve --api-server-count N`, engine_core/api_servers.py) report the
whole server from every one of them, with prometheus-client's multiprocess mode: the supervisor points
PROMETHEUS_MULTIPROC_DIR at a fresh directory of its own before it starts them, so every metric they create keeps
its value in a memory-mapped file there (one per process), and each /metrics merges all the files: counters and
histograms summed over the processes, the engine core's gauges (which every process mirrors from the same
snapshots) taken from the most recent writer, once. What is not summed is rendered by the answering process
itself: which process answered, and the tenants' usage, which is already the server's (the shared usage store).
"""

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ridgeline.engine.step_record import StepRecord
from ridgeline.errors import RidgelineError
from ridgeline.napkin.token_cost import PhaseWork, TokenCost, split_step, token_cost
from ridgeline.tenancy.metrics import DB_ERRORS_HELP, TenantMetrics

# Seconds; spans a fast decode step on a GPU to a long queue on a busy CPU.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
FINISH_REASONS = ("stop", "length", "abort")
COST_WINDOW_S = 60.0  # the live $/Mtok is the last minute's: long enough to span bursts, short enough to follow load
COST_TOKENS = ("prompt", "completion", "blended")
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's: read when it is imported, so set before then
# The engine core's gauges, mirrored by every API process from the same snapshots: the latest write of a live
# process wins (a dead process's files for it are removed by mark_process_dead), so each is reported once.
MIRRORED = "livemostrecent"
EPOCH_DEFAULT = 1e-9  # the time a mirrored gauge's starting 0 is written at: earlier than any real write


def shared_metrics_dir() -> str:
    """The directory the API processes' metrics are merged from. prometheus-client picks memory-mapped values at
    import when PROMETHEUS_MULTIPROC_DIR is set (the supervisor sets it before starting the process), so both must
    hold, or this process's counts would never reach the others' scrapes."""
    path = os.environ.get(MULTIPROC_DIR_ENV)
    if not path or not os.path.isdir(path) or not getattr(prometheus_values.ValueClass, "_multiprocess", False):
        raise RidgelineError(f"several API processes need {MULTIPROC_DIR_ENV} set to a directory before "
                             "prometheus_client is imported (serve --api-server-count does it)")
    return path


def window_work(steps: Sequence[StepRecord], now: float, window_s: float, since: float) -> PhaseWork:
    """What the engine did in the window (now - window_s, now], paid from `since` at the earliest (the server's
    start, or the oldest step the recorder still holds once it has dropped older ones). Prompt tokens are the
    prefill chunks' (computed, so prefix-cache hits cost nothing); completion tokens one per decode row plus one
    per prompt chunk that samples (a request's first token); each step's forward pass shared by rows."""
    start = max(now - window_s, since)
    prompt = completion = 0
    prefill_s = decode_s = 0.0
    for step in steps:
        if step.timestamp <= start:
            continue
        prompt += step.prefill_tokens
        completion += step.decode_rows + sum(1 for chunk in step.prefill_chunks if chunk.samples)
        p, d = split_step(step.seconds, step.prefill_tokens, step.decode_rows)
        prefill_s, decode_s = prefill_s + p, decode_s + d
    return PhaseWork(prompt, completion, prefill_s, decode_s, max(0.0, now - start))


@dataclass
class LiveCost:
    """This machine's $/Mtok at its configured price, from the engine's recorded steps over the last window."""

    usd_per_hour: float
    steps: Callable[[], tuple[list[StepRecord], int]]  # the kept steps, and how many were ever recorded
    window_s: float = COST_WINDOW_S
    started: float = 0.0  # wall clock when serving began (nothing before it is paid for)

    def now_cost(self, now: float | None = None) -> TokenCost:
        now = time.time() if now is None else now
        kept, recorded = self.steps()
        since = self.started
        if kept and recorded > len(kept):  # the ring buffer dropped older steps: pay only for what it still covers
            since = max(since, kept[0].timestamp - kept[0].seconds)
        return token_cost(window_work(kept, now, self.window_s, since), self.usd_per_hour)


class ApiServerInfo(Collector):
    """Which API process answered this scrape: rendered by that process alone (never merged from the files, where
    every process's would show at once)."""

    def __init__(self, model_name: str, index: int, count: int):
        self.labels = [model_name, str(index), str(count), str(os.getpid())]

    def collect(self):
        info = GaugeMetricFamily("ridgeline_api_server_info", "The API process that answered this scrape, among "
                                 "the server's (1).", labels=["model_name", "index", "count", "pid"])
        info.add_metric(self.labels, 1)
        yield info


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, summed: bool = False):
        """summed: one of several API processes (shared_metrics_dir): /metrics merges all of theirs."""
        self.registry = CollectorRegistry()  # this process's metrics
        self.exposed = self.registry  # what /metrics and the dashboard read
        if summed:
            self.exposed = CollectorRegistry()
            MultiProcessCollector(self.exposed, shared_metrics_dir())
        self.model_name = model_name
        labels = {"model_name": model_name}
        mirrored: list[Gauge] = []

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, list(labels), registry=self.registry, buckets=LATENCY_BUCKETS).labels(**labels)

        def gauge(name: str, doc: str) -> Gauge:  # (the multiprocess mode only counts with several processes)
            mirrored.append(Gauge(name, doc, list(labels), registry=self.registry,
                                  multiprocess_mode=MIRRORED).labels(**labels))
            return mirrored[-1]

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, list(labels), registry=self.registry).labels(**labels)

        self.time_to_first_token = histogram("ridgeline_time_to_first_token_seconds", "Arrival to first output token.")
        self.inter_token_latency = histogram("ridgeline_inter_token_latency_seconds", "Gap between consecutive output tokens.")
        self.time_per_output_token = histogram(
            "ridgeline_time_per_output_token_seconds", "Per request: (last token - first token) / (output tokens - 1)."
        )
        self.e2e_latency = histogram("ridgeline_e2e_request_latency_seconds", "Arrival to finish.")
        self.queue_time = histogram("ridgeline_request_queue_time_seconds", "Arrival to first scheduled.")

        self.num_running = gauge("ridgeline_num_requests_running", "Sequences in the running batch.")
        self.num_waiting = gauge("ridgeline_num_requests_waiting", "Sequences waiting for admission (incl. preempted).")
        # Counted in pages: one block of tokens for one layer group's layers (all groups draw on one pool).
        self.kv_cache_usage = gauge("ridgeline_kv_cache_usage_perc", "Fraction of KV-cache pages in use (0..1).")
        self.num_free_pages = gauge("ridgeline_kv_cache_free_pages", "KV-cache pages free for allocation.")
        self.num_total_pages = gauge("ridgeline_kv_cache_total_pages", "KV-cache pages in the pool.")
        self.prefix_cache_hit_rate = gauge("ridgeline_prefix_cache_hit_rate", "Prefix-cache hits / queries so far (0..1).")
        self.num_preemptions = gauge("ridgeline_num_preemptions", "Preemptions so far.")
        self.num_prefilled_tokens = gauge("ridgeline_prefilled_tokens", "Prompt tokens computed so far (prefix-cache hits and the shared prompt of n > 1 skip theirs).")

        self.spec_draft_tokens = gauge("ridgeline_spec_decode_draft_tokens", "Guessed tokens verified so far (speculative decoding).")
        self.spec_accepted_tokens = gauge("ridgeline_spec_decode_accepted_tokens", "Guessed tokens the model agreed with so far.")
        self.spec_acceptance_rate = gauge("ridgeline_spec_decode_acceptance_rate", "Accepted / guessed tokens so far (0..1).")
        self.spec_tokens_per_step = gauge("ridgeline_spec_decode_tokens_per_step", "Mean tokens a verifying decode step produced.")
        # Structured outputs: how many requests were constrained, what compiling their grammars cost and how often
        # the cache spared it, and the masks (computed beside the forward pass; the wait is what steps lost to them).
        self.constrained_requests = gauge("ridgeline_structured_requests", "Requests with an output constraint so far.")
        self.grammars_compiled = gauge("ridgeline_grammar_compiled", "Grammars compiled so far (cache misses).")
        self.grammar_cache_hits = gauge("ridgeline_grammar_cache_hits", "Constraints found compiled in the cache so far.")
        self.grammars_refused = gauge("ridgeline_grammar_refused", "Constraints refused (400) by the grammar engine so far.")
        self.grammar_compile_seconds = gauge("ridgeline_grammar_compile_seconds", "Total time spent compiling grammars.")
        self.grammar_masks = gauge("ridgeline_grammar_masks",
                                   "Token masks computed on the mask worker so far (one per constrained row per step, "
                                   "but not for plain greedy rows or rows sampled with temperature alone: they check "
                                   "the token they chose).")
        self.grammar_masks_at_sampling = gauge(
            "ridgeline_grammar_masks_at_sampling",
            "Token masks computed when a row was sampled, after its forward pass (a checked token the grammar refused).")
        self.grammar_mask_at_sampling_seconds = gauge("ridgeline_grammar_mask_at_sampling_seconds",
                                                      "Total time computing masks at sampling (on the step's path).")
        self.grammar_mask_seconds = gauge("ridgeline_grammar_mask_seconds", "Total time computing masks (beside the forward pass).")
        self.grammar_mask_wait_seconds = gauge("ridgeline_grammar_mask_wait_seconds",
                                               "Total time steps waited for masks after their forward pass.")
        # Disaggregated prefill and decode (cluster/kv_transfer): what a decode worker pulled, what a prefill
        # worker served, and how the front placed each prefill.
        self.kv_pages_received = counter("ridgeline_kv_transfer_pages_received", "KV pages pulled from prefill workers.")
        self.kv_bytes_received = counter("ridgeline_kv_transfer_bytes_received", "KV page bytes pulled from prefill workers.")
        self.kv_transfer_seconds = histogram("ridgeline_kv_transfer_seconds", "Time to pull one request's KV pages.")
        self.kv_transfers_failed = counter("ridgeline_kv_transfers_failed", "KV transfers that ended in failure.")
        self.kv_pages_sent = gauge("ridgeline_kv_transfer_pages_sent", "KV pages served to decode workers so far.")
        self.kv_bytes_sent = gauge("ridgeline_kv_transfer_bytes_sent", "KV page bytes served to decode workers so far.")
        self.kv_held_requests = gauge("ridgeline_kv_held_requests", "Requests whose KV pages wait to be collected.")
        # Work nobody waits for (issue 38): requests aborted because their client left or their deadline passed,
        # and prefills that still completed after the client had left (one in the step under way when it left:
        # at most the requests in flight then; more means the abort did not travel).
        self.requests_client_left = counter("ridgeline_requests_client_left",
                                            "Requests aborted because their client left before the answer was whole.")
        self.requests_deadline_exceeded = counter("ridgeline_requests_deadline_exceeded",
                                                  "Requests dropped because their x-ridgeline-deadline-ms passed.")
        self.prefills_for_gone_clients = counter("ridgeline_prefills_for_gone_clients",
                                                 "Prefills whose first token was computed after their client left.")
        self.prompt_tokens = counter("ridgeline_prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("ridgeline_generation_tokens", "Output tokens of finished requests.")
        self._finished = Counter(
            "ridgeline_request_success",
            "Finished requests by finish reason.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.finished = {reason: self._finished.labels(**labels, finished_reason=reason) for reason in FINISH_REASONS}
        self.live_cost: LiveCost | None = None  # serve --usd-per-hour: enable_cost() adds the cost gauges
        self.api_server_requests: Counter | None = None  # one of several API processes: describe_api_server()
        if summed:
            # A most-recent gauge that no process wrote has no sample at all: each starts at 0 as in one process,
            # written as of the epoch (the value's own set, which Gauge.set calls with the time now), so that any
            # process's real snapshot wins over it, even one taken before this process started.
            for mirror in mirrored:
                mirror._value.set(0.0, timestamp=EPOCH_DEFAULT)

    def add_collector(self, collector: Collector) -> None:
        """A collector this process renders itself, not summed over API processes (the tenants' usage, read from
        the store every process shares, is already the whole server's)."""
        self.exposed.register(collector)

    def add_tenants(self, collector: TenantMetrics) -> None:
        """The tenants' metrics: their usage from the shared store, rendered here; of the two counts each process
        keeps, the usage database's errors are summed over the API processes (each has its own connection), and
        failed reloads stay this process's (every process reloads the file on the one SIGHUP)."""
        if self.exposed is not self.registry:
            errors = Counter("ridgeline_tenant_usage_db_errors", DB_ERRORS_HELP, registry=self.registry)
            errors.inc(collector.gate.db_errors)
            collector.gate.on_db_error = errors.inc
            collector.db_errors_elsewhere = True
        self.add_collector(collector)

    def observe_engine(self, stats) -> None:
        """Gauges from one `EngineStats` snapshot (called by the engine thread after every step)."""
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        self.num_free_pages.set(stats.num_free_pages)
        self.num_total_pages.set(stats.num_total_pages)
        self.prefix_cache_hit_rate.set(stats.prefix_cache_hit_rate)
        self.num_preemptions.set(stats.num_preemptions)
        self.num_prefilled_tokens.set(stats.num_prefilled_tokens)
        self.spec_draft_tokens.set(stats.num_draft_tokens)
        self.spec_accepted_tokens.set(stats.num_accepted_tokens)
        self.spec_acceptance_rate.set(stats.acceptance_rate)
        self.spec_tokens_per_step.set(stats.tokens_per_verification)
        self.constrained_requests.set(stats.num_constrained_requests)
        self.grammars_compiled.set(stats.grammars_compiled)
        self.grammar_cache_hits.set(stats.grammar_cache_hits)
        self.grammars_refused.set(stats.grammars_refused)
        self.grammar_compile_seconds.set(stats.grammar_compile_seconds)
        self.grammar_masks.set(stats.grammar_masks)
        self.grammar_mask_seconds.set(stats.grammar_mask_seconds)
        self.grammar_mask_wait_seconds.set(stats.grammar_mask_wait_seconds)
        self.grammar_masks_at_sampling.set(stats.grammar_masks_at_sampling)
        self.grammar_mask_at_sampling_seconds.set(stats.grammar_mask_at_sampling_seconds)

    def observe_kv_received(self, pages: int, num_bytes: int, seconds: float) -> None:
        self.kv_pages_received.inc(pages)
        self.kv_bytes_received.inc(num_bytes)
        self.kv_transfer_seconds.observe(seconds)

    def observe_finished(self, output) -> None:
        """Histograms and counters from one finished `RequestOutput`."""
        timings = output.timings
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        self.generation_tokens.inc(len(output.output_token_ids))
        self.finished[output.finish_reason or "abort"].inc()
        if self.api_server_requests is not None:
            self.api_server_requests.inc()
        if timings.queue_time is not None:
            self.queue_time.observe(timings.queue_time)
        if timings.ttft is not None:
            self.time_to_first_token.observe(timings.ttft)
            for gap in timings.itls:
                self.inter_token_latency.observe(gap)
            if len(timings.token_times) > 1:
                decode_time = timings.token_times[-1] - timings.token_times[0]
                self.time_per_output_token.observe(decode_time / (len(timings.token_times) - 1))
        if timings.e2e is not None:
            self.e2e_latency.observe(timings.e2e)

    def enable_cost(self, live_cost: LiveCost) -> None:
        """Price this machine: the cost gauges appear (an unpriced server shows none rather than a $0 that reads as
        free), refreshed from the step records whenever /metrics or the dashboard reads them."""
        labels = {"model_name": self.model_name}
        self.live_cost = live_cost
        self.usd_per_hour = Gauge("ridgeline_usd_per_hour", "The machine's configured price, US dollars an hour.",
                                  list(labels), registry=self.registry).labels(**labels)
        per_mtok = Gauge("ridgeline_usd_per_mtok",
                         f"US dollars per million tokens over the last {live_cost.window_s:g} s at the configured price: "
                         "prompt, completion, or all (blended); NaN while none was served.", [*labels, "tokens"],
                         registry=self.registry)
        self.usd_per_mtok = {kind: per_mtok.labels(**labels, tokens=kind) for kind in COST_TOKENS}
        self.cost_utilisation = Gauge("ridgeline_cost_window_busy_ratio",
                                      "Share of the cost window the engine spent in forward passes (0..1).",
                                      list(labels), registry=self.registry).labels(**labels)

    def describe_api_server(self, index: int, count: int) -> None:
        """One of several API processes over one engine core: a scrape reaches whichever the kernel gave the
        connection, so it says which, and what each process finished (the `api_server` label: at most `count`
        values). Every other counter and histogram is the whole server's, summed over the processes."""
        self.add_collector(ApiServerInfo(self.model_name, index, count))
        self.api_server_requests = Counter(
            "ridgeline_api_server_requests", "Finished requests per API process (how the port spread them).",
            ["model_name", "api_server"], registry=self.registry).labels(model_name=self.model_name,
                                                                         api_server=str(index))

    def refresh_cost(self, now: float | None = None) -> TokenCost | None:
        """Set the cost gauges from the live window (None: no price configured, nothing is set)."""
        if self.live_cost is None:
            return None
        cost = self.live_cost.now_cost(now)
        self.usd_per_hour.set(cost.usd_per_hour)
        for kind, value in zip(COST_TOKENS, (cost.prompt_usd_per_mtok, cost.completion_usd_per_mtok,
                                             cost.blended_usd_per_mtok)):
            self.usd_per_mtok[kind].set(float("nan") if value is None else value)
        self.cost_utilisation.set(cost.utilisation)
        return cost

    def render(self) -> bytes:
        self.refresh_cost()
        return generate_latest(self.exposed)
