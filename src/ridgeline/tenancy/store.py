"""Each tenant's counted windows and all-time usage, in one SQLite file that any number of server or router
processes share (WAL: readers never wait for the writer; `BEGIN IMMEDIATE`: a check and the admission it allows
are one transaction, so two processes cannot both take the last slot of a limit). It survives restarts:
admissions are committed before the request runs.

Synchronous and not thread-safe: the gate (gate.py) calls it from one worker thread of its own."""

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from ridgeline.tenancy.config import Limits
from ridgeline.tenancy.limiter import DAY, MINUTE, Rejection, Windows, check, window_start

_SCHEMA = """
CREATE TABLE IF NOT EXISTS windows (
    tenant TEXT NOT NULL, length INTEGER NOT NULL, start INTEGER NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, length, start)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage (
    tenant TEXT PRIMARY KEY, requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rejections (
    tenant TEXT NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, reason)) WITHOUT ROWID;
"""
_PRUNE_EVERY = 256  # admissions between deletions of windows long past


@dataclass(frozen=True)
class Reservation:
    """Tokens counted into a tenant's windows at admission; settled (the unused part given back) at finish."""

    tenant: str
    tokens: int
    minute_start: int
    day_start: int
    recorded: bool = True  # False: the store failed and the request was let through uncounted


@dataclass
class TenantUsage:
    tenant: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    rejected: dict[str, int] = field(default_factory=dict)  # by the limit that refused
    minute_requests: int = 0
    minute_tokens: int = 0
    day_tokens: int = 0

    def as_json(self) -> dict:
        return {"tenant": self.tenant, "requests": self.requests, "rejected": sum(self.rejected.values()),
                "rejected_by_limit": dict(self.rejected), "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens, "cost_usd": round(self.cost_usd, 9),
                "this_minute": {"requests": self.minute_requests, "tokens": self.minute_tokens},
                "today": {"tokens": self.day_tokens}}


class UsageStore:
    def __init__(self, path: Path, busy_timeout_s: float = 2.0):
        self.path = Path(path)
        # isolation_level=None: transactions are ours (BEGIN IMMEDIATE), not the module's implicit ones.
        self.db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process crash, one fsync less
        self.db.executescript(_SCHEMA)
        self._admissions = 0

    def close(self) -> None:
        self.db.close()

    def reserve(self, tenant: str, limits: Limits, tokens: int, now: float) -> Reservation | Rejection:
        minute, day = window_start(now, MINUTE), window_start(now, DAY)
        with self._transaction():
            windows = Windows(*self._window(tenant, MINUTE, minute), self._window(tenant, DAY, day)[1])
            rejection = check(limits, windows, tokens, now)
            if rejection is not None:
                self.db.execute("INSERT INTO rejections (tenant, reason, count) VALUES (?, ?, 1) ON CONFLICT DO "
                                "UPDATE SET count = count + 1", (tenant, rejection.reason))
                return rejection
            for length, start in ((MINUTE, minute), (DAY, day)):
                self.db.execute("INSERT INTO windows (tenant, length, start, requests, tokens) VALUES (?, ?, ?, 1, ?) "
                                "ON CONFLICT DO UPDATE SET requests = requests + 1, tokens = tokens + excluded.tokens",
                                (tenant, length, start, tokens))
            self.db.execute("INSERT INTO usage (tenant, requests) VALUES (?, 1) ON CONFLICT DO UPDATE SET "
                            "requests = requests + 1", (tenant,))
            self._admissions += 1
            if self._admissions % _PRUNE_EVERY == 0:
                self.db.execute("DELETE FROM windows WHERE start + 2 * length < ?", (now,))
        return Reservation(tenant, tokens, minute, day)

    def settle(self, reservation: Reservation, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
               cost_usd: float) -> None:
        """The request's real use: its windows keep what it used (never more than it reserved: admission promised
        no more), the rest given back; its usage totals grow by what it used."""
        unused = max(0, reservation.tokens - prompt_tokens - completion_tokens)
        with self._transaction():
            if reservation.recorded and unused:
                for length, start in ((MINUTE, reservation.minute_start), (DAY, reservation.day_start)):
                    self.db.execute("UPDATE windows SET tokens = max(0, tokens - ?) WHERE tenant = ? AND length = ? "
                                    "AND start = ?", (unused, reservation.tenant, length, start))
            self.db.execute(
                "INSERT INTO usage (tenant, prompt_tokens, cached_tokens, completion_tokens, cost_usd) VALUES "
                "(?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                "cached_tokens = cached_tokens + excluded.cached_tokens, completion_tokens = completion_tokens + "
                "excluded.completion_tokens, cost_usd = cost_usd + excluded.cost_usd",
                (reservation.tenant, prompt_tokens, cached_tokens, completion_tokens, cost_usd))

    def usage(self, tenants: list[str], now: float) -> dict[str, TenantUsage]:
        """Totals and current windows of these tenants (rows of tenants no longer in the file are left out)."""
        found = {name: TenantUsage(name) for name in tenants}
        if not found:
            return found
        marks = ", ".join("?" * len(found))
        names = list(found)
        for name, *totals in self.db.execute("SELECT tenant, requests, prompt_tokens, cached_tokens, completion_tokens, "
                                             f"cost_usd FROM usage WHERE tenant IN ({marks})", names):
            row = found[name]
            row.requests, row.prompt_tokens, row.cached_tokens, row.completion_tokens, row.cost_usd = totals
        for name, reason, count in self.db.execute(f"SELECT tenant, reason, count FROM rejections WHERE tenant IN ({marks})",
                                                   names):
            found[name].rejected[reason] = count
        minute, day = window_start(now, MINUTE), window_start(now, DAY)
        for name, length, requests, tokens in self.db.execute(
                f"SELECT tenant, length, requests, tokens FROM windows WHERE tenant IN ({marks}) AND "
                "((length = ? AND start = ?) OR (length = ? AND start = ?))", [*names, MINUTE, minute, DAY, day]):
            if length == MINUTE:
                found[name].minute_requests, found[name].minute_tokens = requests, tokens
            else:
                found[name].day_tokens = tokens
        return found

    def _window(self, tenant: str, length: int, start: int) -> tuple[int, int]:
        row = self.db.execute("SELECT requests, tokens FROM windows WHERE tenant = ? AND length = ? AND start = ?",
                              (tenant, length, start)).fetchone()
        return row or (0, 0)

    def _transaction(self):
        return _Immediate(self.db)


class _Immediate:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an error): takes the write lock before reading, so what is read is
    what the write is based on, across processes."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, *_):
        self.db.execute("ROLLBACK" if kind else "COMMIT")
        return False
