"""The tenants file (TOML): each tenant's hashed keys, limits, priority class and, optionally, prices.

    [pricing]                         # optional, for every tenant without its own
    prompt_usd_per_mtok = 0.15
    completion_usd_per_mtok = 0.60

    [tenants.acme]
    keys = ["sha256:9f86d0..."]       # `ridgeline keys new` prints a key and its hash
    priority = "interactive"          # interactive, standard (default), batch, or an integer (lower first)
    requests_per_minute = 600         # each limit is optional: absent means none
    tokens_per_minute = 200000        # prompt + max_tokens at admission, the unused part refunded at finish
    tokens_per_day = 10000000         # UTC day
    admin = true                      # may read every tenant's usage

Loading checks everything and names what is wrong; a file that fails to load is never half applied.
"""

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ridgeline.errors import RidgelineError
from ridgeline.tenancy.keys import is_key_hash
from ridgeline.tenancy.pricing import FREE, Pricing, pricing_from
from ridgeline.tenancy.priority import priority_value

# Tenant names become Prometheus label values: short and plain, and only ever from this file.
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_LIMITS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day")
_FIELDS = {"keys", "priority", "admin", "pricing", *_LIMITS}


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None


@dataclass(frozen=True)
class Tenant:
    name: str
    limits: Limits = Limits()
    priority: int = 0
    admin: bool = False
    pricing: Pricing = FREE
    key_hashes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TenantsConfig:
    tenants: dict[str, Tenant] = field(default_factory=dict)

    def __post_init__(self):
        by_hash = {h: t for t in self.tenants.values() for h in t.key_hashes}
        object.__setattr__(self, "by_hash", by_hash)

    def tenant_for(self, key_hash: str) -> Tenant | None:
        return self.by_hash.get(key_hash)


def parse_tenants(document: dict, where: str = "tenants file") -> TenantsConfig:
    unknown = set(document) - {"pricing", "tenants"}
    if unknown:
        raise ValueError(f"{where}: unknown table(s) {', '.join(sorted(unknown))} (known: pricing, tenants)")
    default_pricing = pricing_from(_table(document.get("pricing", {}), f"{where} [pricing]"), f"{where} [pricing]")
    tables = _table(document.get("tenants", {}), f"{where} [tenants]")
    if not tables:
        raise ValueError(f"{where}: no [tenants.NAME] table: define at least one tenant")
    tenants, owners = {}, {}
    for name, table in tables.items():
        at = f"{where} [tenants.{name}]"
        if not _NAME.fullmatch(name):
            raise ValueError(f"{at}: a tenant name is 1-64 of A-Z a-z 0-9 _ . -")
        table = _table(table, at)
        unknown = set(table) - _FIELDS
        if unknown:
            raise ValueError(f"{at}: unknown field(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_FIELDS))})")
        keys = table.get("keys", [])
        if not isinstance(keys, list) or not keys:
            raise ValueError(f"{at}: keys must be a non-empty list of key hashes (`ridgeline keys hash KEY`)")
        for key in keys:
            if not isinstance(key, str) or not is_key_hash(key):
                raise ValueError(f"{at}: {str(key)[:12]!r}... is not a key hash: store `sha256:<64 hex>` "
                                 "(`ridgeline keys hash KEY`), never the key itself")
            if key in owners:
                raise ValueError(f"{at}: a key hash is also tenant {owners[key]!r}'s")
            owners[key] = name
        limits = {}
        for limit in _LIMITS:
            value = table.get(limit)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{at}: {limit} must be a whole number >= 1")
            limits[limit] = value
        admin = table.get("admin", False)
        if not isinstance(admin, bool):
            raise ValueError(f"{at}: admin must be true or false")
        pricing = pricing_from(_table(table["pricing"], f"{at} pricing"), f"{at} pricing") if "pricing" in table else default_pricing
        tenants[name] = Tenant(name, Limits(**limits), priority_value(table.get("priority", 0), at), admin, pricing,
                               tuple(keys))
    return TenantsConfig(tenants)


def load_tenants(path: Path) -> TenantsConfig:
    """The file's tenants, or a RidgelineError (one line) naming the file and what is wrong."""
    try:
        document = tomllib.loads(Path(path).read_text())
        return parse_tenants(document, str(path))
    except OSError as error:
        raise RidgelineError(f"cannot read the tenants file {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise RidgelineError(f"the tenants file {path} is not valid TOML: {error}") from None
    except ValueError as error:
        raise RidgelineError(str(error)) from None


def _table(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a table")
    return value
