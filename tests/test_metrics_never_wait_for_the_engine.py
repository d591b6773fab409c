"""/metrics and /health answer from what the engine last published, never by taking the engine: while the engine
lock is held (as a long prefill step holds it), both answer, and the lock is provably still held when they do.
Without timing thresholds: a scrape that waited for the lock would never answer while this test holds it."""

import re

import httpx

from server_helpers import serve_tiny_model


def _gauge(text: str, name: str) -> float:
    return float(re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M).group(1))


def test_metrics_and_health_answer_while_the_engine_lock_is_held():
    with serve_tiny_model() as server:
        driver = server.server.config.app.state.serving.engine
        # A request first, so the published snapshot has something in it.
        completion = httpx.post(f"{server.url}/v1/completions",
                                json={"prompt": "the quick brown fox", "max_tokens": 2}, timeout=30).json()
        prompt_tokens = completion["usage"]["prompt_tokens"]
        before = httpx.get(f"{server.url}/metrics", timeout=30).text
        with driver.engine_lock:  # the engine is busy, as in a step: nothing on the event loop may wait for it
            health = httpx.get(f"{server.url}/health", timeout=10)
            scrape = httpx.get(f"{server.url}/metrics", timeout=10)
            assert driver.engine_lock.locked()  # still ours: neither answer came from taking it
        assert health.status_code == 200
        assert scrape.status_code == 200
        # The gauges are those the engine published after its last step.
        assert _gauge(scrape.text, "ridgeline_prefilled_tokens") == _gauge(before, "ridgeline_prefilled_tokens") >= prompt_tokens
        assert _gauge(scrape.text, "ridgeline_kv_cache_total_pages") == driver.snapshot.stats.num_total_pages


def test_what_is_changed_off_the_engine_thread_is_published_on_release():
    """A prefill worker's KV source frees pages on its own thread, holding engine_access(): it publishes a new
    snapshot before letting go, so the next scrape counts those pages (test_disaggregated_serving checks that
    every page is back, by /metrics, right after each transfer)."""
    with serve_tiny_model() as server:
        driver = server.server.config.app.state.serving.engine
        before = driver.snapshot
        with driver.engine_access():
            assert driver.engine_lock.locked()
            assert driver.snapshot is before
        assert driver.snapshot is not before and not driver.engine_lock.locked()
