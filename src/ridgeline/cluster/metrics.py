"""The router's Prometheus metrics, in its own registry: requests and failovers per replica, refusals per model, `auto` decisions by
chosen model and kind, decision time, and per-replica health, counted load and affinity."""

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

DECISION_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01)


class RouterMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ridgeline_router_requests", "Requests by model, replica and outcome.",
                                ["model", "replica", "outcome"], registry=r)
        # A client's request that no replica took (each busy, down or refusing): answered 503, or a busy backend's
        # own 429/503, with Retry-After. With requests{outcome="ok"} it accounts for every request a client sent.
        self.refusals = Counter("ridgeline_router_refusals", "Requests no replica took, answered 429/503 with "
                                "Retry-After, by model and status.", ["model", "status"], registry=r)
        self.failovers = Counter("ridgeline_router_failovers", "Requests moved to another replica before starting.",
                                 ["model", "from_replica"], registry=r)
        self.decisions = Counter("ridgeline_router_auto_decisions", "`auto` requests by chosen model and why.",
                                 ["model", "kind"], registry=r)
        self.decision_seconds = Histogram("ridgeline_router_decision_seconds", "Time to choose model and replica.",
                                          registry=r, buckets=DECISION_BUCKETS)
        self.replica_up = Gauge("ridgeline_router_replica_up", "1 if the replica is in rotation.", ["replica"], registry=r)
        self.in_flight = Gauge("ridgeline_router_in_flight", "Requests in flight, counted at dispatch.", ["replica"], registry=r)
        self.backlog = Gauge("ridgeline_router_prefill_backlog_tokens", "Prompt tokens waiting to be prefilled.",
                             ["replica"], registry=r)
        self.cached_blocks = Gauge("ridgeline_router_replica_cached_blocks", "Prefix blocks the replica reports holding.",
                                   ["replica"], registry=r)
        self.prompt_tokens = Counter("ridgeline_router_prompt_tokens", "Prompt tokens dispatched.", ["replica"], registry=r)
        self.affinity_tokens = Counter("ridgeline_router_affinity_cached_tokens",
                                       "Prompt tokens expected cached on the replica they were sent to.", ["replica"],
                                       registry=r)
        self.usd_per_mtok = Gauge("ridgeline_router_usd_per_mtok",
                                  "US dollars per million prompt or completion tokens on the replica, at its configured "
                                  "hourly price and its current rates.", ["replica", "tokens"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
