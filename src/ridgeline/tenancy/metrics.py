"""Per-tenant usage as Prometheus counters, from the shared usage store: every process sharing the file reports
the same totals, and they survive restarts. Labels are tenant names from the tenants file only (and a refusal's
limit, one of three), so a client cannot grow the label set by sending keys."""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ridgeline.tenancy.store import TenantUsage

REJECTION_REASONS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day")
DB_ERRORS_HELP = "Usage-database operations that failed (the requests were served, uncounted)."


class TenantMetrics(Collector):
    """Renders the last snapshot handed to update() (the /metrics handler reads the store first, off its loop)."""

    def __init__(self, gate):
        self.gate = gate
        self.snapshot: dict[str, TenantUsage] = {}
        self.db_errors_elsewhere = False  # True: a counter summed over API processes reports them (server/metrics.py)

    def update(self, usage: dict[str, TenantUsage]) -> None:
        self.snapshot = usage

    def collect(self):
        rows = [u for name, u in self.snapshot.items() if name in set(self.gate.tenant_names)]
        families = {
            "requests": CounterMetricFamily("ridgeline_tenant_requests", "Requests admitted per tenant.", labels=["tenant"]),
            "prompt_tokens": CounterMetricFamily("ridgeline_tenant_prompt_tokens", "Prompt tokens of finished requests per tenant.", labels=["tenant"]),
            "cached_tokens": CounterMetricFamily("ridgeline_tenant_cached_prompt_tokens", "Prompt tokens found in the prefix cache per tenant.", labels=["tenant"]),
            "completion_tokens": CounterMetricFamily("ridgeline_tenant_completion_tokens", "Completion tokens per tenant.", labels=["tenant"]),
            "cost_usd": CounterMetricFamily("ridgeline_tenant_cost_usd", "What the tenant's tokens cost, in US dollars (tenants file's pricing).", labels=["tenant"]),
        }
        for row in rows:
            for field, family in families.items():
                family.add_metric([row.tenant], getattr(row, field))
        rejected = CounterMetricFamily("ridgeline_tenant_rejected", "Requests refused (429) per tenant and limit.",
                                       labels=["tenant", "limit"])
        for row in rows:
            for reason in REJECTION_REASONS:
                rejected.add_metric([row.tenant, reason], row.rejected.get(reason, 0))
        minute_tokens = GaugeMetricFamily("ridgeline_tenant_minute_tokens", "Tokens counted in the current minute "
                                          "(reserved by running requests, used by finished ones).", labels=["tenant"])
        for row in rows:
            minute_tokens.add_metric([row.tenant], row.minute_tokens)
        errors = CounterMetricFamily("ridgeline_tenant_usage_db_errors", DB_ERRORS_HELP)
        errors.add_metric([], self.gate.db_errors)
        reloads = CounterMetricFamily("ridgeline_tenant_reloads_failed", "SIGHUP reloads of the tenants file that "
                                      "failed (the previous file stayed in force).")
        reloads.add_metric([], self.gate.reloads_failed)
        yield from families.values()
        yield from (rejected, minute_tokens) if self.db_errors_elsewhere else (rejected, minute_tokens, errors)
        yield reloads
