"""SIGTERM that is graceful (issue 38): past --drain-timeout, what is still running is answered with an explicit
503 shutting_down (never a cut connection) and the process exits within the grace plus a little; a second
SIGTERM exits at once."""

import signal
import threading
import time

import httpx

from server_helpers import serve_tiny_model_process

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
