"""SIGTERM that is graceful (issue 38): past --drain-timeout, what is still running is answered with an explicit
503 shutting_down (never a cut connection) and the process exits within the grace plus a little; a second
SIGTERM exits at once."""

import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx

from server_helpers import serve_tiny_model, serve_tiny_model_process

from ridgeline.cluster.http_replica import HttpReplica
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.server.launcher import BackgroundServer
from ridgeline.server.router_app import create_router_app

BUSY = 12  # requests of 480 tokens each on a batch of one: seconds of work, far beyond a 1 s grace


def load(url: str) -> tuple[list[threading.Thread], list]:
    outcomes: list = []

    def ask() -> None:
        try:
            answer = httpx.post(f"{url}/v1/completions", json={"prompt": "a long answer", "max_tokens": 480,
                                                               "ignore_eos": True}, timeout=60)
            outcomes.append((answer.status_code, answer.json()))
        except (httpx.HTTPError, ValueError) as error:  # cut, or (second SIGTERM) answered with no body
            outcomes.append((None, repr(error)))

    threads = [threading.Thread(target=ask) for _ in range(BUSY)]
    for thread in threads:
        thread.start()
    return threads, outcomes


def test_past_the_grace_live_requests_get_an_explicit_503_and_the_process_exits():
    with serve_tiny_model_process("--drain-timeout", "1", "--max-num-seqs", "1") as (process, url):
        threads, outcomes = load(url)
        time.sleep(0.5)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        exited = time.monotonic() - signalled
        for thread in threads:
            thread.join(30)
    assert exited < 1 + 5, exited  # the grace, uvicorn's flush, and a step
    statuses = [status for status, _ in outcomes]
    assert None not in statuses, outcomes  # none cut: each finished or was told
    assert 503 in statuses
    for status, answer in outcomes:
        assert status == 200 or answer["error"]["code"] == "shutting_down"


def test_a_second_sigterm_exits_at_once():
    with serve_tiny_model_process("--drain-timeout", "60", "--max-num-seqs", "1") as (process, url):
        threads, _ = load(url)
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert process.poll() is None  # draining: the first waits for the work
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        assert time.monotonic() - signalled < 5
        for thread in threads:
            thread.join(30)


# ------------------------------------------------------------------ a proxy's own answer past the grace


def outcome_of(url: str, stream: bool, model: str | None) -> tuple:
    """(status, what ended it): for a stream, the last event before [DONE] (None: cut without [DONE])."""
    request = {"prompt": "a long answer", "max_tokens": 480, "ignore_eos": True, "model": model, "stream": stream}
    try:
        if not stream:
            answer = httpx.post(f"{url}/v1/completions", json=request, timeout=60)
            return answer.status_code, answer.json()
        with httpx.stream("POST", f"{url}/v1/completions", json=request, timeout=60) as answer:
            if answer.status_code != 200:
                answer.read()
                return answer.status_code, answer.json()
            events = [line.removeprefix("data: ") for line in answer.iter_lines() if line.startswith("data: ")]
        return 200, json.loads(events[-2]) if events[-1:] == ["[DONE]"] and len(events) > 1 else None
    except (httpx.HTTPError, ValueError) as error:  # cut
        return None, repr(error)


def storm(url: str, model: str | None = None) -> tuple[list[threading.Thread], list]:
    outcomes: list = []
    threads = [threading.Thread(target=lambda i=i: outcomes.append(outcome_of(url, i % 2 == 0, model)))
               for i in range(8)]
    for thread in threads:
        thread.start()
    return threads, outcomes


def assert_finished_or_told(outcomes: list) -> None:
    assert len(outcomes) == 8 and all(status is not None for status, _ in outcomes), outcomes  # none cut
    told = 0
    for status, last in outcomes:
        assert last is not None, outcomes  # a stream ended with [DONE]
        if status == 503 or "error" in last:
            assert last["error"]["code"] == "shutting_down", last
            told += 1
        else:
            assert status == 200 and last["choices"][0]["finish_reason"] == "length"
    assert told, "nothing was still running past the grace: the test proves nothing"


def workers_idle(*urls: str) -> bool:
    for url in urls:
        sample = {}
        for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                sample[name.split("{")[0]] = sample.get(name.split("{")[0], 0.0) + float(value)
        if not (sample["ridgeline_num_requests_running"] == sample["ridgeline_num_requests_waiting"] == 0
                and sample["ridgeline_kv_cache_free_pages"] == sample["ridgeline_kv_cache_total_pages"]
                and sample["ridgeline_kv_held_requests"] == 0):
            return False
    return True


def wait_until(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the workers did not settle"
        time.sleep(0.05)


def test_past_the_grace_the_proxy_tells_its_clients_itself_and_its_workers_are_left_idle():
    """`ridgeline proxy --drain-timeout 1` over workers that keep running: past the grace every request still in
    flight gets the proxy's own 503 shutting_down (or error event), the proxy exits, and nothing of those requests
    is left on the workers (their upstream requests were cancelled, the prefilled pages released)."""
    with serve_tiny_model(max_num_seqs=1, role="prefill") as prefill, serve_tiny_model(max_num_seqs=1, role="decode") \
            as decode:
        command = [sys.executable, "-c", "from ridgeline.cli import main; main()", "proxy", "--prefill", prefill.url,
                   "--decode", decode.url, "--port", "0", "--drain-timeout", "1", "--local-prefill-tokens", "1"]
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        try:
            url = None
            while url is None:
                line = process.stderr.readline()
                assert line, "the proxy did not start"
                if match := re.search(r"Uvicorn running on (http://[\d.]+:\d+)", line):
                    url = match.group(1)
            threads, outcomes = storm(url)
            time.sleep(0.5)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
            exited = time.monotonic() - signalled
            for thread in threads:
                thread.join(30)
        finally:
            if process.poll() is None:
                process.kill()
        assert exited < 1 + 5, exited
        assert_finished_or_told(outcomes)
        wait_until(lambda: workers_idle(prefill.url, decode.url), 5.0)


def test_past_the_grace_the_router_tells_its_clients_itself():
    """The router's drain (as `ridgeline router --drain-timeout` starts it on SIGTERM), over a replica that keeps
    running: its own 503 / error event for what is left past the grace, nothing left on the replica."""
    with serve_tiny_model(max_num_seqs=1) as worker:
        async def build() -> Router:
            replica = HttpReplica("m/0", "m", worker.url, served_name="tiny-llama")
            router = Router([ModelGroup("m", 0.5, [replica])], {"m/0": Rates(2000.0, 100.0, "configured")},
                            health_interval_s=3600, learn_rates=False)
            await router.start()
            return router

        app = create_router_app(build)
        with BackgroundServer(app) as router:
            threads, outcomes = storm(router.url, "m")
            time.sleep(0.5)
            begun = threading.Event()
            router.server.servers[0].get_loop().call_soon_threadsafe(
                lambda: (app.state.begin_shutdown(1.0), begun.set()))
            assert begun.wait(5)
            late = httpx.post(f"{router.url}/v1/completions", json={"prompt": "x", "max_tokens": 1, "model": "m"})
            assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
            for thread in threads:
                thread.join(30)
        assert_finished_or_told(outcomes)
        wait_until(lambda: workers_idle(worker.url), 5.0)
