"""The tenants file, the limiter, the shared usage store and the gate, without a server: what a tenant may spend,
how it is counted, and that the count holds across threads and processes sharing one SQLite file."""

import asyncio
import multiprocessing
import sqlite3
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.errors import RidgelineError
from ridgeline.tenancy.config import Limits, Tenant, load_tenants, parse_tenants
from ridgeline.tenancy.gate import LimitExceeded, TenantGate
from ridgeline.tenancy.keys import hash_key, new_key
from ridgeline.tenancy.limiter import DAY, MINUTE, Windows, check
from ridgeline.tenancy.pricing import Pricing, pricing_from
from ridgeline.tenancy.priority import PRIORITY_CLASSES, effective_priority
from ridgeline.tenancy.store import UsageStore

KEY = "rl-test-key-one"
T0 = 1_799_971_200.0  # a fixed wall clock at the start of a UTC day (so of a minute too)


def tenants_toml(**limits) -> str:
    lines = [f"{name} = {value}" for name, value in limits.items()]
    return "\n".join(["[tenants.acme]", f'keys = ["{hash_key(KEY)}"]', 'priority = "batch"', *lines]) + "\n"


# -- the file --------------------------------------------------------------------------------------------------

def test_the_documented_example_loads(tmp_path):
    path = tmp_path / "tenants.toml"
    path.write_text(f"""
[pricing]
prompt_usd_per_mtok = 0.15
completion_usd_per_mtok = 0.60

[tenants.acme]
keys = ["{hash_key(KEY)}"]
priority = "interactive"
requests_per_minute = 600
tokens_per_minute = 200000
tokens_per_day = 10000000
admin = true

[tenants.batch-co]
keys = ["{hash_key('other')}"]
priority = 5
pricing = {{ prompt_usd_per_mtok = 0.05, completion_usd_per_mtok = 0.2 }}
""")
    config = load_tenants(path)
    acme = config.tenant_for(hash_key(KEY))
    assert acme.name == "acme" and acme.admin and acme.priority == PRIORITY_CLASSES["interactive"]
    assert acme.limits == Limits(600, 200_000, 10_000_000)
    assert acme.pricing == Pricing(0.15, 0.60)
    other = config.tenant_for(hash_key("other"))
    assert other.priority == 5 and not other.admin and other.limits == Limits()
    assert other.pricing == Pricing(0.05, 0.2)
    assert config.tenant_for(hash_key("nobody")) is None


@pytest.mark.parametrize("text, named", [
    ('[tenants.a]\nkeys = ["rl-plain-key"]\n', "never the key itself"),
    ('[tenants.a]\nkeys = []\n', "non-empty list"),
    (f'[tenants.a]\nkeys = ["{hash_key(KEY)}"]\nrpm = 3\n', "unknown field(s) rpm"),
    (f'[tenants.a]\nkeys = ["{hash_key(KEY)}"]\n[tenants.b]\nkeys = ["{hash_key(KEY)}"]\n', "also tenant 'a'"),
    (f'[tenants.a]\nkeys = ["{hash_key(KEY)}"]\ntokens_per_minute = 0\n', "tokens_per_minute must be a whole number"),
    (f'[tenants.a]\nkeys = ["{hash_key(KEY)}"]\npriority = "urgent"\n', "unknown priority class 'urgent'"),
    (f'[tenants."a b"]\nkeys = ["{hash_key(KEY)}"]\n', "tenant name"),
    ('[pricing]\nusd_per_hour = 3\n[tenants.a]\nkeys = []\n', "usd_per_hour needs"),
    ("", "no [tenants.NAME] table"),
    ("[tenants.a\n", "not valid TOML"),
])
def test_a_bad_file_is_refused_with_its_reason(tmp_path, text, named):
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    with pytest.raises(RidgelineError, match=None) as refused:
        load_tenants(path)
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_a_missing_file_is_named():
    with pytest.raises(RidgelineError, match="cannot read the tenants file /nowhere/tenants.toml"):
        load_tenants("/nowhere/tenants.toml")


def test_keys_are_hashed_and_new_keys_differ():
    key = new_key()
    assert hash_key(key).startswith("sha256:") and key not in hash_key(key)
    assert new_key() != key and hash_key(key) == hash_key(key)


def test_hourly_price_becomes_a_price_per_token():
    pricing = pricing_from({"usd_per_hour": 3.6, "prompt_tokens_per_second": 1000,
                            "completion_tokens_per_second": 100}, "here")
    # $3.6/h = $0.001/s: a second buys 1,000 prompt tokens or 100 completion tokens
    assert pricing.prompt_usd_per_mtok == pytest.approx(1.0) and pricing.completion_usd_per_mtok == pytest.approx(10.0)
    assert pricing.cost(1000, 0, 100) == pytest.approx(0.002)
    cached = Pricing(1.0, 10.0, cached_prompt_usd_per_mtok=0.5)
    assert cached.cost(1000, 400, 0) == pytest.approx((600 * 1.0 + 400 * 0.5) / 1e6)


@given(st.integers(-20, 20), st.none() | st.integers(-20, 20))
def test_a_request_never_goes_ahead_of_its_tenants_class(tenant, requested):
    effective = effective_priority(tenant, requested)
    assert effective >= tenant  # lower is earlier: never earlier than the class
    assert effective == (tenant if requested is None else max(tenant, requested))


# -- the limiter -----------------------------------------------------------------------------------------------

@settings(deadline=None, max_examples=60)
@given(rpm=st.none() | st.integers(1, 8), tpm=st.none() | st.integers(1, 400),
       asks=st.lists(st.tuples(st.integers(1, 150), st.floats(0, 59.9)), max_size=25))
def test_a_minute_admits_exactly_what_fits(tmp_path_factory, rpm, tpm, asks):
    """Every request that fits what the minute still holds is admitted, every other refused: nothing over the limit
    and nothing refused that fit (within one minute, in arrival order)."""
    store = UsageStore(tmp_path_factory.mktemp("usage") / "usage.sqlite")
    limits = Limits(rpm, tpm)
    requests = tokens = 0
    for ask, offset in sorted(asks, key=lambda a: a[1]):
        result = store.reserve("t", limits, ask, T0 + offset)
        fits = (rpm is None or requests < rpm) and (tpm is None or tokens + ask <= tpm)
        assert hasattr(result, "tenant") == fits, (requests, tokens, ask)
        if fits:
            requests, tokens = requests + 1, tokens + ask
        else:
            assert 1 <= result.retry_after <= 60 and result.retry_after >= 60 - offset - 1
    usage = store.usage(["t"], T0 + 59.95)["t"]
    assert (usage.minute_requests, usage.minute_tokens, usage.requests) == (requests, tokens, requests)
    assert sum(usage.rejected.values()) == len(asks) - requests


def test_the_next_minute_starts_empty_but_the_day_remembers(tmp_path):
    store = UsageStore(tmp_path / "usage.sqlite")
    limits = Limits(requests_per_minute=1, tokens_per_day=250)
    assert store.reserve("t", limits, 100, T0).tokens == 100
    assert store.reserve("t", limits, 100, T0 + 30).reason == "requests_per_minute"
    assert store.reserve("t", limits, 100, T0 + MINUTE).tokens == 100
    refused = store.reserve("t", limits, 100, T0 + 2 * MINUTE)
    assert refused.reason == "tokens_per_day" and refused.retry_after == DAY - 2 * MINUTE
    assert store.reserve("t", limits, 100, T0 + DAY).tokens == 100


def test_a_request_larger_than_the_minute_says_so():
    refused = check(Limits(tokens_per_minute=50), Windows(), 80, T0)
    assert refused.reason == "tokens_per_minute" and "request too large" in refused.message


def test_settling_gives_back_what_was_not_used(tmp_path):
    store = UsageStore(tmp_path / "usage.sqlite")
    limits = Limits(tokens_per_minute=200, tokens_per_day=1000)
    held = store.reserve("t", limits, 110, T0)  # a 10-token prompt with max_tokens=100
    store.settle(held, prompt_tokens=10, cached_tokens=0, completion_tokens=5, cost_usd=0.25)
    usage = store.usage(["t"], T0 + 1)["t"]
    assert (usage.minute_tokens, usage.day_tokens) == (15, 15)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cost_usd) == (10, 5, 0.25)
    assert store.reserve("t", limits, 185, T0 + 2).tokens == 185  # 15 + 185 = 200: fits exactly
    store.close()
    reopened = UsageStore(tmp_path / "usage.sqlite")  # a restart keeps every count
    assert reopened.usage(["t"], T0 + 3)["t"].minute_tokens == 200


def _hammer(path: str, attempts: int, admitted) -> None:
    store = UsageStore(path)
    for _ in range(attempts):
        if hasattr(store.reserve("shared", Limits(requests_per_minute=20, tokens_per_minute=10_000), 7, T0), "tenant"):
            with admitted.get_lock():
                admitted.value += 1


def test_processes_sharing_the_file_enforce_one_limit(tmp_path):
    path = str(tmp_path / "usage.sqlite")
    UsageStore(path).close()
    context = multiprocessing.get_context("spawn")
    admitted = context.Value("i", 0)
    workers = [context.Process(target=_hammer, args=(path, 15, admitted)) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert admitted.value == 20
    usage = UsageStore(path).usage(["shared"], T0)["shared"]
    assert (usage.minute_requests, usage.minute_tokens, usage.rejected["requests_per_minute"]) == (20, 140, 25)


def test_threads_each_with_a_connection_enforce_one_limit(tmp_path):
    path = tmp_path / "usage.sqlite"
    results, lock = [], threading.Lock()

    def worker():
        store = UsageStore(path)
        for _ in range(10):
            result = store.reserve("shared", Limits(tokens_per_minute=333), 10, T0)
            with lock:
                results.append(hasattr(result, "tenant"))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(results) == 33


# -- the gate --------------------------------------------------------------------------------------------------

def test_one_key_from_many_connections_at_once_gets_exactly_its_limit(tmp_path):
    (tmp_path / "t.toml").write_text(tenants_toml(requests_per_minute=7))
    gate = TenantGate(tmp_path / "t.toml", clock=lambda: T0)
    tenant = gate.authenticate(f"Bearer {KEY}".encode())

    async def burst():
        return await asyncio.gather(*(gate.reserve(tenant, 5) for _ in range(40)), return_exceptions=True)

    results = asyncio.run(burst())
    assert sum(not isinstance(r, Exception) for r in results) == 7
    assert all(isinstance(r, LimitExceeded) for r in results if isinstance(r, Exception))
    gate.close()


def test_keys_tenants_and_the_plain_api_key(tmp_path):
    (tmp_path / "t.toml").write_text(tenants_toml())
    gate = TenantGate(tmp_path / "t.toml", api_key="operator")
    assert gate.authenticate(f"Bearer {KEY}".encode()).name == "acme"
    assert gate.authenticate(b"Bearer wrong") is None and gate.authenticate(b"") is None
    assert gate.authenticate(KEY.encode()) is None  # no scheme
    operator = gate.authenticate(b"Bearer operator")
    assert operator.admin and operator.limits == Limits()
    assert gate.tenant_names == ["acme", "api-key"]
    assert (tmp_path / "t.usage.sqlite").exists()  # the default store sits beside the file
    gate.close()


def test_a_reload_that_fails_keeps_the_last_good_file(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(tenants_toml(requests_per_minute=1))
    gate = TenantGate(path)
    path.write_text("this is not toml [")
    assert not gate.reload() and gate.reloads_failed == 1
    assert gate.authenticate(f"Bearer {KEY}".encode()).limits.requests_per_minute == 1
    path.write_text(tenants_toml(requests_per_minute=9))
    assert gate.reload()
    assert gate.authenticate(f"Bearer {KEY}".encode()).limits.requests_per_minute == 9
    gate.close()


def test_a_locked_database_lets_requests_through_uncounted_and_counts_the_error(tmp_path):
    (tmp_path / "t.toml").write_text(tenants_toml(requests_per_minute=1))
    gate = TenantGate(tmp_path / "t.toml", clock=lambda: T0)
    gate.store.db.execute("PRAGMA busy_timeout = 50")
    tenant = gate.authenticate(f"Bearer {KEY}".encode())
    blocker = sqlite3.connect(tmp_path / "t.usage.sqlite", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    held = asyncio.run(gate.reserve(tenant, 10))
    assert not held.recorded and gate.db_errors == 1
    blocker.execute("ROLLBACK")
    gate.settle(tenant, held, 4, 0, 3)  # the totals still get what it used; no window was counted to refund
    assert asyncio.run(gate.usage())["acme"].completion_tokens == 3
    asyncio.run(gate.reserve(tenant, 10))  # the one request of this minute: the uncounted one did not take it
    with pytest.raises(LimitExceeded):
        asyncio.run(gate.reserve(tenant, 10))
    gate.close()


def test_an_unopenable_database_stops_start_up(tmp_path):
    (tmp_path / "t.toml").write_text(tenants_toml())
    with pytest.raises(RidgelineError, match="cannot open the usage database"):
        TenantGate(tmp_path / "t.toml", tmp_path / "no-such-dir" / "usage.sqlite")


def test_tenant_objects_are_plain_data():
    assert Tenant("x").limits == Limits() and Tenant("x").priority == 0
