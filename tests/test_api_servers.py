"""`serve --engine-core process --api-server-count 2`: two API processes on one port in front of one engine core.
Concurrent requests reach both (each answer says which served it) with the same greedy outputs as one API
process; whichever process a scrape reaches, its /metrics counts every request of the server, exactly as the
clients counted them, the core's gauges once, and what each process served under its `api_server` label; a
killed core fails the streams of both with engine_dead and both recover, their counts neither lost nor doubled;
SIGTERM leaves no process behind.

The two-API-process server is started once for the module (a start is seconds of process spawning); the test that
kills its core leaves it recovered, and the last test stops it."""

import contextlib
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import serve_tiny_model_process

PROMPTS = [f"{start} {n}" for n in range(6) for start in ("The quick brown fox", "Once upon a time")]
HEADER = "x-ridgeline-api-server"
KEY = "rl-test-acme"  # the two-API-process server's one tenant (its usage: the shared store's, in every scrape)
AUTH = {"Authorization": f"Bearer {KEY}"}


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        path = Path(f"/proc/{todo[0]}/task/{todo[0]}/children")
        todo = todo[1:]
        with contextlib.suppress(FileNotFoundError):
            kids = [int(child) for child in path.read_text().split()]
            found += kids
            todo += kids
    return found


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def complete(url: str, prompt: str) -> tuple[str, str, dict]:
    """(the answer's text, the API process that served it, its usage); a new connection each (the kernel picks the
    process)."""
    reply = httpx.post(f"{url}/v1/completions", timeout=60, headers=AUTH,
                       json={"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"], reply.headers.get(HEADER), reply.json()["usage"]


def answers(url: str) -> list[tuple[str, str, dict]]:
    with ThreadPoolExecutor(8) as pool:  # concurrent: both processes hold requests in the one core at once
        return list(pool.map(lambda prompt: complete(url, prompt), PROMPTS))


def scrape_each(url: str) -> dict[str, str]:
    """/metrics of every API process: scrapes on new connections until each index answered."""
    pages: dict[str, str] = {}
    assert wait_for(lambda: pages.setdefault((r := httpx.get(f"{url}/metrics")).headers[HEADER], r.text) and
                    len(pages) == 2)
    return pages


def scrapes(url: str, count: int = 8) -> list[tuple[str, dict]]:
    """`count` scrapes, each on a new connection (so either process may answer), until both answered at least once:
    (the index that answered, its samples: (name, labels) -> value)."""
    pages: list[tuple[str, dict]] = []
    while len(pages) < count or len({index for index, _ in pages}) < 2:
        assert len(pages) < 200, "one API process never answered /metrics"
        reply = httpx.get(f"{url}/metrics")
        pages.append((reply.headers[HEADER], {(s.name, frozenset(s.labels.items())): s.value
                                              for family in text_string_to_metric_families(reply.text)
                                              for s in family.samples}))
    return pages


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and labels.items() <= dict(sample_labels).items())


def server_counts(samples: dict) -> dict[str, float]:
    """The request and token counters a client can check against its own counts."""
    return {"requests": total(samples, "ridgeline_e2e_request_latency_seconds_count"),
            "finished": total(samples, "ridgeline_request_success_total"),
            "prompt_tokens": total(samples, "ridgeline_prompt_tokens_total"),
            "completion_tokens": total(samples, "ridgeline_generation_tokens_total"),
            "ttft_observed": total(samples, "ridgeline_time_to_first_token_seconds_count"),
            "tenant_requests": total(samples, "ridgeline_tenant_requests_total", tenant="acme")}


def counts_of(pages: list[tuple[str, dict]]) -> dict[str, float]:
    """The counts every scrape showed: the same, whichever process answered it."""
    seen = [server_counts(samples) for _, samples in pages]
    assert all(counts == seen[0] for counts in seen), [(index, counts) for (index, _), counts in zip(pages, seen)]
    return seen[0]


def served_by_each(samples: dict) -> dict[str, float]:
    return {i: total(samples, "ridgeline_api_server_requests_total", api_server=i) for i in ("0", "1")}


def stop_leaves_nothing(process) -> None:
    family = descendants(process.pid)
    assert len(family) >= 3  # the core and the two API processes (multiprocessing's resource tracker, perhaps)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    assert wait_for(lambda: all(gone(pid) for pid in family), 10), "a child outlived serve"


@pytest.fixture(scope="module")
def two_apis(tmp_path_factory):
    """(process, url) of `serve --engine-core process --api-server-count 2` with one tenant, once both API processes
    listen."""
    from ridgeline.tenancy.keys import hash_key

    tenants = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    tenants.write_text(f'[tenants.acme]\nkeys = ["{hash_key(KEY)}"]\n')
    with serve_tiny_model_process("--engine-core", "process", "--api-server-count", "2", "--tenants", str(tenants),
                                  "--drain-timeout", "1") as (process, url):
        # Both listen once both have said so on /health (until then the kernel gives every connection to the other).
        seen: set[str] = set()
        assert wait_for(lambda: seen.add(httpx.get(f"{url}/health").headers[HEADER]) or len(seen) == 2, 60)
        yield process, url


def test_two_api_processes_serve_concurrently_as_one(two_apis):
    with serve_tiny_model_process("--engine-core", "process", "--drain-timeout", "1") as (one, url):
        expected = [text for text, _, _ in answers(url)]
        one.send_signal(signal.SIGTERM)
        one.wait(60)
    _, url = two_apis
    first = scrapes(url)
    before, served_before = counts_of(first), served_by_each(first[0][1])  # whatever was sent first
    got = answers(url)
    assert [text for text, _, _ in got] == expected
    served_by = [index for _, index, _ in got]
    assert set(served_by) == {"0", "1"}, served_by  # so neither process alone served all K
    pages = scrapes(url)
    # Every scrape, from either process, counts all K requests and their tokens, exactly as the clients did.
    assert {name: value - before[name] for name, value in counts_of(pages).items()} == {
        "requests": len(got), "finished": len(got), "ttft_observed": len(got),
        "tenant_requests": len(got),  # from the store both processes share: counted once, not summed again
        "prompt_tokens": sum(usage["prompt_tokens"] for _, _, usage in got),
        "completion_tokens": sum(usage["completion_tokens"] for _, _, usage in got)}
    for index, samples in pages:
        # What each process served, under its label, in either's scrape; and which one answered this one.
        assert {i: n - served_before[i] for i, n in served_by_each(samples).items()} == \
               {i: served_by.count(i) for i in ("0", "1")}
        assert total(samples, "ridgeline_api_server_info", index=index) == 1
        # The core's gauges once: no pid label, not one per process.
        running = [(labels, value) for (name, labels), value in samples.items()
                   if name == "ridgeline_num_requests_running"]
        assert running == [(frozenset({("model_name", "tiny-llama")}), 0.0)], running
        assert total(samples, "ridgeline_kv_cache_total_pages") > 0
    # The dashboard's counters read the same merged registry: the whole server's from either process too.
    dashboards: dict[str, dict] = {}
    assert wait_for(lambda: dashboards.setdefault((r := httpx.get(f"{url}/dashboard/state", headers=AUTH)).headers[
        HEADER], r.json()["counters"]) and len(dashboards) == 2)
    assert {index: shown["generation_tokens"] for index, shown in dashboards.items()} == \
           {index: counts_of(pages)["completion_tokens"] for index in ("0", "1")}


def test_a_killed_core_fails_both_api_processes_then_both_recover(two_apis):
    process, url = two_apis
    api_pids = {int(page.split('pid="')[1].split('"')[0]) for page in scrape_each(url).values()}
    start = counts_of(scrapes(url))
    streams: dict[str, list[str]] = {}  # API process -> the events of one stream it serves
    lock = threading.Lock()

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=60, headers=AUTH,
                          json={"prompt": "Once", "max_tokens": 450, "ignore_eos": True, "stream": True}) as reply:
            with lock:
                if reply.headers[HEADER] in streams:
                    return  # that process has one already: leave, its abort frees the core
                events = streams[reply.headers[HEADER]] = []
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    events.append(line)

    threads = []
    while len(streams) < 2 and len(threads) < 40:
        threads.append(threading.Thread(target=stream))
        threads[-1].start()
        time.sleep(0.05)
    assert wait_for(lambda: len(streams) == 2 and all(streams.values()), 30)
    core = next(pid for pid in descendants(process.pid) if pid not in api_pids
                and b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes())
    killed = time.monotonic()
    os.kill(core, signal.SIGKILL)  # serve is its parent and reaps it: the pid is not reused meanwhile
    for thread in threads:
        thread.join(10)
    assert time.monotonic() - killed < 5, "in-flight streams must end at once, not hang"
    for events in streams.values():
        errors = [json.loads(line[5:])["error"] for line in events if '"error"' in line]
        assert errors and errors[0]["code"] == "engine_dead" and events[-1] == "data: [DONE]", events[-3:]
    # The supervisor started a new core; both API processes take requests again.
    healthy: set[str] = set()
    assert wait_for(lambda: (r := httpx.get(f"{url}/health")).status_code == 200 and healthy.add(r.headers[HEADER])
                    or len(healthy) == 2, 60)
    # What the API processes counted outlives the core (the counts are theirs), and the next requests add exactly
    # themselves in every scrape.
    recovered = counts_of(scrapes(url))
    assert recovered["requests"] >= start["requests"] and recovered["completion_tokens"] >= start["completion_tokens"]
    again = [complete(url, "again") for _ in range(4)]
    assert all(text for text, _, _ in again)
    counts = counts_of(scrapes(url))
    assert counts["requests"] - recovered["requests"] == 4
    assert counts["completion_tokens"] - recovered["completion_tokens"] == \
           sum(usage["completion_tokens"] for _, _, usage in again)


def test_sigterm_leaves_no_process_behind(two_apis):
    stop_leaves_nothing(two_apis[0])


def test_the_next_core_ready_before_this_process_saw_the_death_is_not_lost(tmp_path, monkeypatch):
    """The supervisor restarts a dead core at once; the next core may say it is ready to an API process that has not
    yet seen the death. That CoreReady must survive the restart's rebinding, and what the dead core left (here its
    EngineDead) must not end the wait: else that API process stays unready (/health 503) for good."""
    import subprocess
    import sys

    import zmq
    from ridgeline.server.engine_core.messages import CoreReady, EngineDead, encode
    from ridgeline.server.engine_core.process import AttachedCore, CoreSockets

    monkeypatch.setattr(AttachedCore, "_adopt", lambda self, ready: ready)  # no tokenizer or limits in these fakes
    sockets = CoreSockets(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
    attached = AttachedCore(None, sockets)
    context = zmq.Context()
    cores = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]

    def ready(pid: int) -> bytes:
        return encode(CoreReady(pid, "fake", None, 1, None, "", None, 1.0, None, None))

    pushes: list[zmq.Socket] = []  # closed before the context ends, however the test ends

    def say(*frames: bytes) -> zmq.Socket:
        pushes.append(push := context.socket(zmq.PUSH))
        push.setsockopt(zmq.LINGER, 0)
        push.connect(sockets.outbound)
        for frame in frames:
            push.send(frame)
        return push

    try:
        first = say(ready(cores[0].pid))
        assert attached.start(timeout=10).pid == cores[0].pid
        first.send(encode(EngineDead("killed")))
        cores[0].kill()
        cores[0].wait()
        say(ready(cores[1].pid))
        assert attached.pull.poll(5000)  # both frames wait at this process before it restarts
        time.sleep(0.2)
        assert not attached.alive
        assert attached.start(timeout=5).pid == cores[1].pid
        assert attached.alive
    finally:
        for core in cores:
            core.kill()
        for push in pushes:
            push.close(linger=0)
        attached.close()
        context.term()


WRITER = """
import json, sqlite3, sys
from pathlib import Path
from prometheus_client.parser import text_string_to_metric_families
from ridgeline.server.metrics import ServerMetrics
from ridgeline.server.tenants import install_tenancy
from ridgeline.tenancy.gate import TenantGate
from fastapi import FastAPI
metrics = ServerMetrics("m", summed=True)
metrics.describe_api_server(int(sys.argv[1]), 2)
metrics.add_tenants(install_tenancy(FastAPI(), gate := TenantGate(Path(sys.argv[3]))))
values = json.loads(sys.argv[2])
for _ in range(values.pop("db_errors", 0)):
    gate._failed("settlement", sqlite3.OperationalError("database is locked"))  # as the store's worker reports one
for name, value in values.items():
    getattr(metrics, name).inc(value) if name.endswith("tokens") else getattr(metrics, name).set(value)
print(json.dumps({s.name: s.value for f in text_string_to_metric_families(metrics.render().decode())
                  for s in f.samples if s.name.startswith(("ridgeline_prompt", "ridgeline_kv_cache_total",
                                                           "ridgeline_tenant_usage_db_errors"))}))
gate.close()
"""


def test_the_merged_metrics_of_processes_that_come_and_go(tmp_path):
    """The files behind the summed /metrics, process by process (as the supervisor's API processes write them): a
    process that starts after another mirrored the core's gauges does not hide that snapshot behind its starting
    zeros, and an ended process's counts stay in the totals once its gauges are dropped. The usage database's
    errors, which each process counts on its own connection, are summed too."""
    import subprocess
    import sys

    from prometheus_client.multiprocess import mark_process_dead
    from ridgeline.tenancy.keys import hash_key

    (metrics_dir := tmp_path / "metrics").mkdir()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(f'[tenants.acme]\nkeys = ["{hash_key(KEY)}"]\n')

    def api_process(index: int, **values: float) -> tuple[int, dict]:
        done = subprocess.run([sys.executable, "-c", WRITER, str(index), json.dumps(values), str(tenants)],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert api_process(0, prompt_tokens=7, num_total_pages=64, db_errors=1) == {
        "ridgeline_prompt_tokens_total": 7, "ridgeline_kv_cache_total_pages": 64,
        "ridgeline_tenant_usage_db_errors_total": 1}
    first = next(int(path.stem.split("_")[-1]) for path in metrics_dir.glob("gauge_*.db"))
    assert api_process(1, prompt_tokens=5, db_errors=2) == {
        "ridgeline_prompt_tokens_total": 12, "ridgeline_kv_cache_total_pages": 64,
        "ridgeline_tenant_usage_db_errors_total": 3}
    mark_process_dead(first, str(metrics_dir))
    assert api_process(1) == {"ridgeline_prompt_tokens_total": 12, "ridgeline_kv_cache_total_pages": 0,
                              "ridgeline_tenant_usage_db_errors_total": 3}


def test_several_api_processes_need_the_shared_directory(monkeypatch):
    """An app told it is one of several API processes, without the directory prometheus-client needs, refuses to
    start rather than count only its own requests."""
    from ridgeline.errors import RidgelineError
    from ridgeline.server.metrics import ServerMetrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(RidgelineError, match="PROMETHEUS_MULTIPROC_DIR"):
        ServerMetrics("m", summed=True)
