"""The tenants gate: which tenant a key is, and whether its next request may run, asked once per request by
the server's admission path (server/serving.py) before anything is submitted to the engine.

The store runs on one worker thread of its own: a SQLite transaction that waits for another process's lock
never blocks the event loop, and within this process the store's calls keep their order (a request's
settlement is written before the usage read that follows its response). If the store fails (locked past its
timeout, disk full, file gone), requests are still served, uncounted: the failure is logged and counted in
`ridgeline_tenant_usage_db_errors_total`, never answered as an error the client caused."""

import asyncio
import hmac
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ridgeline.errors import RidgelineError
from ridgeline.tenancy.config import Limits, Tenant, TenantsConfig, load_tenants
from ridgeline.tenancy.keys import hash_key
from ridgeline.tenancy.limiter import DAY, MINUTE, Rejection, window_start
from ridgeline.tenancy.priority import effective_priority
from ridgeline.tenancy.store import Reservation, TenantUsage, UsageStore

logger = logging.getLogger("ridgeline.tenancy")

# The single --api-key, when given beside a tenants file: a tenant of its own, unlimited, that may read every
# tenant's usage (an operator's key). Its name is fixed, so metric labels stay those of the file plus this one.
API_KEY_TENANT = "api-key"


def default_usage_db(tenants_path: Path) -> Path:
    """Beside the tenants file: tenants.toml -> tenants.usage.sqlite."""
    return Path(tenants_path).with_suffix(".usage.sqlite")


class LimitExceeded(Exception):
    def __init__(self, tenant: str, rejection: Rejection):
        super().__init__(rejection.message)
        self.tenant = tenant
        self.rejection = rejection


class TenantGate:
    def __init__(self, tenants_path: Path, usage_db: Path | None = None, api_key: str | None = None, clock=time.time):
        self.tenants_path = Path(tenants_path)
        self.config: TenantsConfig = load_tenants(self.tenants_path)  # a bad file stops start-up, with its reason
        self.api_key = api_key
        self.clock = clock
        self.reloads_failed = 0
        self.db_errors = 0
        self.on_db_error: Callable[[], None] | None = None  # also told of each (several API processes sum them)
        self._lock = threading.Lock()  # db_errors is written from the worker thread, read by /metrics
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ridgeline-usage")
        usage_db = Path(usage_db) if usage_db is not None else default_usage_db(self.tenants_path)
        try:
            self.store = self._worker.submit(UsageStore, usage_db).result()
        except sqlite3.Error as error:
            raise RidgelineError(f"cannot open the usage database {usage_db}: {error}") from None

    # -- keys and tenants ---------------------------------------------------------------------------------------

    def authenticate(self, authorization: bytes) -> Tenant | None:
        """The tenant of an `Authorization: Bearer KEY` header, or None for a missing or unknown key."""
        scheme, _, key = authorization.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not key:
            return None
        if self.api_key is not None and hmac.compare_digest(key.encode(), self.api_key.encode()):
            return Tenant(API_KEY_TENANT, Limits(), admin=True)
        return self.config.tenant_for(hash_key(key))

    @property
    def tenant_names(self) -> list[str]:
        names = list(self.config.tenants)
        return names + [API_KEY_TENANT] if self.api_key is not None else names

    def reload(self) -> bool:
        """Read the tenants file again (SIGHUP). A file that does not load leaves the last good one in force."""
        try:
            config = load_tenants(self.tenants_path)
        except RidgelineError as error:
            self.reloads_failed += 1
            logger.error("tenants file not reloaded, the previous one stays in force: %s", error)
            return False
        self.config = config
        logger.info("tenants file reloaded: %d tenants", len(config.tenants))
        return True

    def priority(self, tenant: Tenant, requested: int | None) -> int:
        return effective_priority(tenant.priority, requested)

    # -- admission and settlement -------------------------------------------------------------------------------

    async def reserve(self, tenant: Tenant, tokens: int) -> Reservation:
        """Count one request reserving `tokens` into the tenant's windows, or raise LimitExceeded."""
        now = self.clock()
        result = await asyncio.wrap_future(self._worker.submit(self._reserve, tenant, tokens, now))
        if isinstance(result, Rejection):
            raise LimitExceeded(tenant.name, result)
        return result

    def _reserve(self, tenant: Tenant, tokens: int, now: float) -> Reservation | Rejection:
        try:
            return self.store.reserve(tenant.name, tenant.limits, tokens, now)
        except sqlite3.Error as error:
            self._failed("admission", error)
            return Reservation(tenant.name, tokens, window_start(now, MINUTE), window_start(now, DAY), recorded=False)

    def settle(self, tenant: Tenant, reservation: Reservation, prompt_tokens: int, cached_tokens: int,
               completion_tokens: int) -> None:
        """Record what the request used (queued: the caller never waits for the database)."""
        cost = tenant.pricing.cost(prompt_tokens, cached_tokens, completion_tokens)
        self._worker.submit(self._settle, reservation, prompt_tokens, cached_tokens, completion_tokens, cost)

    def _settle(self, reservation: Reservation, *used) -> None:
        try:
            self.store.settle(reservation, *used)
        except sqlite3.Error as error:
            self._failed("settlement", error)

    async def usage(self, names: list[str] | None = None) -> dict[str, TenantUsage]:
        """These tenants' usage (default: every tenant of the file); empty if the store cannot be read."""
        return await asyncio.wrap_future(self._worker.submit(self._usage, names or self.tenant_names))

    def _usage(self, names: list[str]) -> dict[str, TenantUsage]:
        try:
            return self.store.usage(names, self.clock())
        except sqlite3.Error as error:
            self._failed("usage read", error)
            return {}

    def _failed(self, what: str, error: sqlite3.Error) -> None:
        with self._lock:
            self.db_errors += 1
        if self.on_db_error is not None:
            self.on_db_error()
        logger.error("usage database %s failed (request served uncounted): %s", what, error)

    def close(self) -> None:
        self._worker.submit(self.store.close)
        self._worker.shutdown(wait=True)
