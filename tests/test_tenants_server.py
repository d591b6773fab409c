"""Tenants through the real server and the real `openai` client: 429s with Retry-After and OpenAI's error shape
past each limit and before any compute, refunds at finish, one limit across two servers sharing a usage file,
SIGHUP reloads, hashed keys, and usage (endpoint and /metrics) equal to the responses' own `usage` summed."""

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from ridgeline.tenancy.keys import hash_key
from server_helpers import serve_tiny_model, serve_tiny_model_process, tiny_model_path

ACME, BATCH, ADMIN = "rl-acme-key", "rl-batch-key", "rl-admin-key"
PROMPT = "Once upon a time"


def write_tenants(path, acme: str = "", batch: str = "") -> None:
    path.write_text(f"""
[pricing]
prompt_usd_per_mtok = 1.0
completion_usd_per_mtok = 4.0

[tenants.acme]
keys = ["{hash_key(ACME)}"]
priority = "interactive"
{acme}

[tenants.batch]
keys = ["{hash_key(BATCH)}"]
priority = "batch"
{batch}

[tenants.ops]
keys = ["{hash_key(ADMIN)}"]
admin = true
""")


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def metric(text: str, name: str, **labels) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()) or line.startswith(f"{name} ") and not wanted:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{wanted}}} not in /metrics")


def usage_of(url: str, key: str) -> dict:
    response = httpx.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def _clear_of_the_minute_boundary(seconds: float = 15.0) -> None:
    """Limits count in fixed wall-clock minutes (tenancy/limiter.py), so a test whose requests straddled a minute
    boundary would see a fresh window mid-test (a CI failure: the fifth of five requests admitted). Start a burst
    only with `seconds` of the minute left, waiting for the next minute otherwise."""
    left = 60.0 - time.time() % 60.0
    if left < seconds:
        time.sleep(left + 0.05)


def test_past_the_requests_per_minute_a_429_before_any_compute(tmp_path):
    write_tenants(tmp_path / "t.toml", acme="requests_per_minute = 2")
    with serve_tiny_model(tenants_file=str(tmp_path / "t.toml")) as server:
        acme = client(server.url, ACME)
        _clear_of_the_minute_boundary()
        for _ in range(2):
            acme.completions.create(model=None, prompt=PROMPT, max_tokens=2)
        before = httpx.get(f"{server.url}/metrics").text
        with pytest.raises(openai.RateLimitError) as refused:
            acme.completions.create(model=None, prompt=PROMPT, max_tokens=2)
        response = refused.value.response
        assert response.status_code == 429 and 1 <= int(response.headers["retry-after"]) <= 60
        assert response.json()["error"] == {"message": "tenant 'acme': rate limit reached: 2 requests per minute",
                                            "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}
        after = httpx.get(f"{server.url}/metrics").text
        # nothing reached the engine: the server's own token counters did not move
        assert metric(after, "ridgeline_prompt_tokens_total") == metric(before, "ridgeline_prompt_tokens_total")
        assert metric(after, "ridgeline_tenant_rejected_total", tenant="acme", limit="requests_per_minute") == 1
        # another tenant is not held back by acme's limit, and a wrong key is a 401, not a tenant
        client(server.url, BATCH).completions.create(model=None, prompt=PROMPT, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            client(server.url, "rl-unknown").completions.create(model=None, prompt=PROMPT, max_tokens=2)


def test_unused_tokens_are_refunded_at_finish_and_the_minute_holds_its_limit(tmp_path):
    write_tenants(tmp_path / "t.toml")
    with serve_tiny_model(tenants_file=str(tmp_path / "t.toml")) as server:
        prompt_tokens = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT},
                                   headers={"Authorization": f"Bearer {ADMIN}"}).json()["count"]
        # A stop string from the greedy answer's first 30 tokens makes a max_tokens=100 request end early.
        text = client(server.url, ADMIN).completions.create(model=None, prompt=PROMPT, max_tokens=30, temperature=0,
                                                             extra_body={"ignore_eos": True}).choices[0].text
    stop = text[len(text) // 3:len(text) // 3 + 3]
    reserve = prompt_tokens + 100
    write_tenants(tmp_path / "t.toml", acme=f"tokens_per_minute = {2 * reserve - 1}")  # two unrefunded never fit
    with serve_tiny_model(tenants_file=str(tmp_path / "t.toml"), usage_db=str(tmp_path / "fresh.sqlite")) as server:
        acme = client(server.url, ACME)
        _clear_of_the_minute_boundary(20.0)
        first = acme.completions.create(model=None, prompt=PROMPT, max_tokens=100, temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True})
        assert first.choices[0].finish_reason == "stop" and first.usage.completion_tokens < 100
        assert usage_of(server.url, ACME)["this_minute"]["tokens"] == first.usage.total_tokens  # not the 100 asked
        second = acme.completions.create(model=None, prompt=PROMPT, max_tokens=100, temperature=0, stop=[stop],
                                         extra_body={"ignore_eos": True})
        held = first.usage.total_tokens + second.usage.total_tokens  # two reservations would not have fit
        assert usage_of(server.url, ACME)["this_minute"]["tokens"] == held
        room = 2 * reserve - 1 - held  # what the minute still holds, to the token
        with pytest.raises(openai.RateLimitError) as refused:
            acme.completions.create(model=None, prompt=PROMPT, max_tokens=room - prompt_tokens + 1)
        assert "tokens per minute" in refused.value.response.json()["error"]["message"]
        acme.completions.create(model=None, prompt=PROMPT, max_tokens=room - prompt_tokens)
        too_big = httpx.post(f"{server.url}/v1/completions", headers={"Authorization": f"Bearer {ACME}"},
                             json={"prompt": PROMPT, "max_tokens": 2 * reserve})
        assert too_big.status_code == 429 and "request too large" in too_big.json()["error"]["message"]


def test_a_spent_daily_budget_is_insufficient_quota_until_tomorrow(tmp_path):
    write_tenants(tmp_path / "t.toml", batch="tokens_per_day = 40")
    with serve_tiny_model(tenants_file=str(tmp_path / "t.toml")) as server:
        batch = client(server.url, BATCH)
        batch.completions.create(model=None, prompt=PROMPT, max_tokens=20, extra_body={"ignore_eos": True})
        with pytest.raises(openai.RateLimitError) as refused:
            batch.completions.create(model=None, prompt=PROMPT, max_tokens=20)
        error = refused.value.response.json()["error"]
        assert error["code"] == "insufficient_quota" and "tokens per day" in error["message"]
        assert 60 < int(refused.value.response.headers["retry-after"]) <= 86_400


def test_usage_and_metrics_equal_the_responses_usage_summed(tmp_path):
    write_tenants(tmp_path / "t.toml")
    with serve_tiny_model(tenants_file=str(tmp_path / "t.toml"), api_key="operator") as server:
        acme, batch = client(server.url, ACME), client(server.url, BATCH)
        seen = {"acme": [], "batch": []}
        long = " ".join([PROMPT, "there was a prompt, a cache and a server."] * 4)  # whole KV blocks to share
        seen["acme"].append(acme.completions.create(model=None, prompt=[long, "a cache"], max_tokens=5, n=2).usage)
        seen["acme"].append(acme.chat.completions.create(model=None, max_tokens=4, messages=[
            {"role": "user", "content": PROMPT}]).usage)
        seen["acme"].append(acme.completions.create(model=None, prompt=long, max_tokens=3).usage)  # a cached prompt
        stream = batch.chat.completions.create(model=None, max_tokens=6, stream=True, stream_options={"include_usage": True},
                                               messages=[{"role": "user", "content": "a prompt and a server"}])
        seen["batch"].append([chunk.usage for chunk in stream if chunk.usage][0])
        for bad in ("rl-nope-1", "rl-nope-2"):  # unknown keys are 401s and never labels
            assert httpx.get(f"{server.url}/v1/usage", headers={"Authorization": f"Bearer {bad}"}).status_code == 401
        text = httpx.get(f"{server.url}/metrics").text
        for name, key in (("acme", ACME), ("batch", BATCH)):
            usages = seen[name]
            mine = usage_of(server.url, key)
            expected = {"tenant": name, "requests": len(usages),
                        "prompt_tokens": sum(u.prompt_tokens for u in usages),
                        "completion_tokens": sum(u.completion_tokens for u in usages),
                        "cached_tokens": sum(u.prompt_tokens_details.cached_tokens for u in usages)}
            assert {k: mine[k] for k in expected} == expected
            assert mine["cost_usd"] == pytest.approx((expected["prompt_tokens"] * 1.0
                                                      + expected["completion_tokens"] * 4.0) / 1e6)
            assert metric(text, "ridgeline_tenant_requests_total", tenant=name) == len(usages)
            assert metric(text, "ridgeline_tenant_prompt_tokens_total", tenant=name) == expected["prompt_tokens"]
            assert metric(text, "ridgeline_tenant_completion_tokens_total", tenant=name) == expected["completion_tokens"]
            assert metric(text, "ridgeline_tenant_cached_prompt_tokens_total", tenant=name) == expected["cached_tokens"]
            assert metric(text, "ridgeline_tenant_cost_usd_total", tenant=name) == pytest.approx(mine["cost_usd"])
        assert seen["acme"][2].prompt_tokens_details.cached_tokens > 0  # the prefix cache's hits are counted apart
        labels = set(re.findall(r'ridgeline_tenant_\w+\{[^}]*tenant="([^"]+)"', text))
        assert labels == {"acme", "batch", "ops", "api-key"}  # the file's tenants and the --api-key, nothing else
        # every tenant's usage is for admin keys: the file's and the --api-key
        assert httpx.get(f"{server.url}/v1/usage/tenants", headers={"Authorization": f"Bearer {ACME}"}).status_code == 403
        for admin in (ADMIN, "operator"):
            rows = httpx.get(f"{server.url}/v1/usage/tenants", headers={"Authorization": f"Bearer {admin}"}).json()
            assert {row["tenant"]: row["requests"] for row in rows["tenants"]}["acme"] == 3


def test_the_plain_keys_are_never_stored(tmp_path):
    write_tenants(tmp_path / "t.toml")
    with serve_tiny_model(tenants_file=str(tmp_path / "t.toml")) as server:
        client(server.url, ACME).completions.create(model=None, prompt=PROMPT, max_tokens=2)
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert stored and ACME.encode() not in stored and BATCH.encode() not in stored
    assert hash_key(ACME).encode() in (tmp_path / "t.toml").read_bytes()


def test_two_servers_sharing_a_usage_file_enforce_one_limit(tmp_path):
    write_tenants(tmp_path / "t.toml", acme="requests_per_minute = 3")
    shared = {"tenants_file": str(tmp_path / "t.toml"), "usage_db": str(tmp_path / "shared.sqlite")}
    with serve_tiny_model(**shared) as one, serve_tiny_model(**shared) as two:
        _clear_of_the_minute_boundary()
        statuses = [httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {ACME}"},
                               json={"prompt": PROMPT, "max_tokens": 2}).status_code
                    for url in (one.url, two.url, one.url, two.url, one.url)]
        assert statuses == [200, 200, 200, 429, 429]
        assert usage_of(one.url, ACME)["requests"] == usage_of(two.url, ACME)["requests"] == 3


def test_sighup_reloads_the_limits_and_a_bad_file_keeps_the_last_good(tmp_path):
    path = tmp_path / "t.toml"
    write_tenants(path, acme="requests_per_minute = 1")
    with serve_tiny_model_process("--tenants", str(path)) as (process, url):
        def status() -> int:
            return httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {ACME}"},
                              json={"prompt": PROMPT, "max_tokens": 1}).status_code

        _clear_of_the_minute_boundary(30.0)  # two reloads, each awaited, inside one minute
        assert [status(), status()] == [200, 429]
        write_tenants(path, acme="requests_per_minute = 3")
        os.kill(process.pid, signal.SIGHUP)
        _until(lambda: status() == 200)  # the reload takes effect on the server's loop, at once
        path.write_text("[tenants.acme\n")
        os.kill(process.pid, signal.SIGHUP)
        _until(lambda: metric(httpx.get(f"{url}/metrics").text, "ridgeline_tenant_reloads_failed_total") == 1)
        assert [status(), status()] == [200, 429]  # 3 a minute still: the last good file stays in force
        assert process.poll() is None


@pytest.mark.parametrize("text, named", [('[tenants.acme]\nkeys = ["rl-a-plain-key"]\n', "never the key itself"),
                                         ("[tenants.acme\n", "not valid TOML")])
def test_a_bad_tenants_file_stops_serve_with_one_line(tmp_path, text, named):
    path = tmp_path / "t.toml"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-c", "from ridgeline.cli import main; main()", "serve",
                             str(tiny_model_path()), "--tenants", str(path)], capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert named in lines[0] and str(path) in lines[0]


def test_keys_hash_prints_what_the_file_stores():
    result = subprocess.run([sys.executable, "-c", "from ridgeline.cli import main; main()", "keys", "hash", "-"],
                            input=f"{ACME}\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == hash_key(ACME)


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_router_counts_every_replica_against_one_limit(tmp_path):
    from cluster_helpers import TEST_RATES, local_group
    from ridgeline.cluster.rates import Rates
    from ridgeline.cluster.router import Router
    from ridgeline.server.launcher import BackgroundServer
    from ridgeline.server.router_app import create_router_app
    from ridgeline.tenancy.gate import TenantGate

    write_tenants(tmp_path / "t.toml", acme="requests_per_minute = 3")

    async def build() -> Router:
        group = local_group("small", replicas=2)
        router = Router([group], {r.name: Rates(*TEST_RATES, "configured") for r in group.replicas},
                        policy="round_robin", health_interval_s=3600, learn_rates=False)
        await router.start()
        return router

    gate = TenantGate(tmp_path / "t.toml")
    with BackgroundServer(create_router_app(build, tenants=gate)) as server:
        acme = client(server.url, ACME)
        _clear_of_the_minute_boundary()
        usages = [acme.completions.create(model="small", prompt=PROMPT, max_tokens=3).usage for _ in range(3)]
        with pytest.raises(openai.RateLimitError) as refused:
            acme.completions.create(model="small", prompt=PROMPT, max_tokens=3)
        assert refused.value.response.json()["error"]["code"] == "rate_limit_exceeded"
        mine = usage_of(server.url, ACME)
        assert (mine["requests"], mine["completion_tokens"]) == (3, sum(u.completion_tokens for u in usages))
        text = httpx.get(f"{server.url}/metrics").text
        assert metric(text, "ridgeline_tenant_requests_total", tenant="acme") == 3
        assert metric(text, "ridgeline_tenant_rejected_total", tenant="acme", limit="requests_per_minute") == 1
        with pytest.raises(openai.AuthenticationError):
            client(server.url, "rl-unknown").completions.create(model="small", prompt=PROMPT, max_tokens=3)


@pytest.mark.parametrize("asked, runs_at", [(None, 10), (3, 10), (20, 20)])
def test_a_tenants_class_is_the_requests_priority_unless_it_asks_to_go_later(asked, runs_at):
    from starlette.requests import Request

    from ridgeline.server.protocol import CompletionRequest
    from ridgeline.server.tenants import apply_priority
    from ridgeline.tenancy.config import Tenant

    raw = Request({"type": "http", "headers": [], "state": {"tenant": Tenant("batch", priority=10)}})
    request = CompletionRequest.model_validate({"prompt": PROMPT, **({"priority": asked} if asked is not None else {})})
    apply_priority(raw, request)
    assert request.priority == runs_at
    untenanted = CompletionRequest.model_validate({"prompt": PROMPT, "priority": -5})
    apply_priority(Request({"type": "http", "headers": []}), untenanted)
    assert untenanted.priority == -5  # no tenants file: the request's own field, as before
