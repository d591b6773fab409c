"""The server's side of tenancy (ridgeline/tenancy): the caller's tenant (set by the key middleware), the one
budget check on the admission path, the settlement at finish, the priority class, /v1/usage, the per-tenant
metrics and SIGHUP reloads. Shared by the one-model server (app.py) and the router (router_app.py)."""

import asyncio
import logging
import signal

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from ridgeline.tenancy.config import Tenant
from ridgeline.tenancy.gate import LimitExceeded, TenantGate
from ridgeline.tenancy.metrics import TenantMetrics
from ridgeline.tenancy.priority import effective_priority
from ridgeline.tenancy.store import Reservation
from ridgeline.server.errors import APIError

logger = logging.getLogger("ridgeline.server")
_CODES = {"tokens_per_day": "insufficient_quota"}  # OpenAI's code for a spent budget; rate limits: rate_limit_exceeded


def tenant_of(raw: Request) -> Tenant | None:
    """The tenant the key middleware found for this request (None: no tenants file)."""
    return raw.scope.get("state", {}).get("tenant")


def reserved_tokens(engine_requests: list) -> int:
    """What a request may use at most: each prompt once (a forked choice shares its first's) and every choice's
    max_tokens, as admission resolved it."""
    return sum(r.request.params.max_tokens + (0 if getattr(r, "fork_of", None) else len(r.request.prompt_token_ids))
               for r in engine_requests)


def apply_priority(raw: Request, request) -> None:
    """The request's priority within its tenant's class (tenancy/priority.py), before its job is built."""
    tenant = tenant_of(raw)
    if tenant is not None:
        requested = request.priority if "priority" in request.model_fields_set else None
        request.priority = effective_priority(tenant.priority, requested)


class TenantAccount:
    """One request's reservation, settled exactly once with what the request used (nothing if it never ran)."""

    def __init__(self, gate: TenantGate, tenant: Tenant, reservation: Reservation):
        self.gate, self.tenant, self.reservation = gate, tenant, reservation
        self._settled = False

    def settle(self, usage=None) -> None:
        if self._settled:
            return
        self._settled = True
        prompt, cached, completion = ((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
                                       usage.completion_tokens) if usage is not None else (0, 0, 0))
        self.gate.settle(self.tenant, self.reservation, prompt, cached, completion)


async def reserve(gate: TenantGate | None, raw: Request, engine_requests: list) -> TenantAccount | None:
    """Count the request against its tenant's limits before anything runs: a 429 with Retry-After if it does
    not fit, so a request never half-runs for want of budget."""
    tenant = tenant_of(raw) if gate is not None else None
    if tenant is None:
        return None
    try:
        reservation = await gate.reserve(tenant, reserved_tokens(engine_requests))
    except LimitExceeded as refused:
        rejection = refused.rejection
        raise APIError(429, f"tenant {tenant.name!r}: {rejection.message}", code=_CODES.get(rejection.reason,
                       "rate_limit_exceeded"), headers={"Retry-After": str(rejection.retry_after)}) from None
    return TenantAccount(gate, tenant, reservation)


def install_tenancy(app: FastAPI, gate: TenantGate) -> TenantMetrics:
    """GET /v1/usage (the caller's tenant), GET /v1/usage/tenants (every tenant: admin keys only), and the
    collector the app's registry renders (its snapshot refreshed by refresh_metrics before each scrape)."""
    collector = TenantMetrics(gate)

    @app.get("/v1/usage")
    async def own_usage(raw: Request) -> Response:
        tenant = tenant_of(raw)
        if tenant is None:
            raise APIError(404, "this server has no tenants file (--tenants)")
        usage = (await gate.usage([tenant.name])).get(tenant.name)
        if usage is None:
            raise APIError(503, "the usage database cannot be read now; retry later", headers={"Retry-After": "1"})
        return JSONResponse({**usage.as_json(), **_limits(tenant)})

    @app.get("/v1/usage/tenants")
    async def all_usage(raw: Request) -> Response:
        tenant = tenant_of(raw)
        if tenant is None or not tenant.admin:
            raise APIError(403, "every tenant's usage is for admin keys only ('admin = true' in the tenants file)",
                           code="permission_denied")
        usage = await gate.usage()
        tenants = {**gate.config.tenants}
        return JSONResponse({"tenants": [{**row.as_json(), **(_limits(tenants[name]) if name in tenants else {})}
                                         for name, row in usage.items()]})

    return collector


async def refresh_metrics(gate: TenantGate, collector: TenantMetrics) -> None:
    collector.update(await gate.usage())


def _limits(tenant: Tenant) -> dict:
    limits = tenant.limits
    return {"limits": {"requests_per_minute": limits.requests_per_minute, "tokens_per_minute": limits.tokens_per_minute,
                       "tokens_per_day": limits.tokens_per_day}, "priority": tenant.priority,
            "pricing": {"prompt_usd_per_mtok": tenant.pricing.prompt_usd_per_mtok,
                        "completion_usd_per_mtok": tenant.pricing.completion_usd_per_mtok,
                        "cached_prompt_usd_per_mtok": tenant.pricing.cached_prompt_usd_per_mtok}}


def reload_on_sighup(gate: TenantGate) -> bool:
    """Reload the tenants file on SIGHUP; False where this loop cannot take signals (a server on a thread)."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, gate.reload)
    except (ValueError, RuntimeError, NotImplementedError):
        return False
    return True
