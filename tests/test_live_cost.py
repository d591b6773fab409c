"""`serve --usd-per-hour`: the live $/Mtok of this machine, from the engine's recorded steps over the last window,
in /metrics and the dashboard's counters."""

import math

import httpx
import pytest

from ridgeline.engine.step_record import PrefillChunk, StepRecord
from ridgeline.server.dashboard import counters
from ridgeline.server.metrics import LiveCost, ServerMetrics
from server_helpers import serve_tiny_model


def step(index: int, timestamp: float, seconds: float, decode_rows: int = 0, prompt_tokens: int = 0) -> StepRecord:
    chunks = (PrefillChunk(0, prompt_tokens, True),) if prompt_tokens else ()
    return StepRecord(index, timestamp, seconds, decode_rows + prompt_tokens, (100,) * decode_rows, chunks, 0.0, 0.0, 0.0)


def priced(steps: list[StepRecord], recorded: int | None = None, started: float = 0.0) -> ServerMetrics:
    metrics = ServerMetrics("m")
    metrics.enable_cost(LiveCost(3.60, lambda: (steps, len(steps) if recorded is None else recorded), started=started))
    return metrics


def gauge(metrics: ServerMetrics, tokens: str) -> float:
    return metrics.registry.get_sample_value("ridgeline_usd_per_mtok", {"model_name": "m", "tokens": tokens})


def test_the_window_is_priced_by_hand():
    # $3.60/h = $0.001/s, so the last 60 s cost $0.06. In it: a 1,000-token prompt prefilled in 1 s (its first token
    # sampled), then 100 decode steps of 4 rows, 0.02 s each (2 s, 400 tokens). A step before the window is not
    # counted. Busy 3 s of 60: prefill takes a third of the $0.06, decode two thirds.
    steps = [step(0, 900.0, 5.0, prompt_tokens=5000), step(1, 950.0, 1.0, prompt_tokens=1000)]
    steps += [step(2 + i, 960.0 + i * 0.02, 0.02, decode_rows=4) for i in range(100)]
    metrics = priced(steps)
    cost = metrics.refresh_cost(now=1000.0)
    assert cost.prompt_usd_per_mtok == pytest.approx(0.02 / 1000 * 1e6)  # $20.00
    assert cost.completion_usd_per_mtok == pytest.approx(0.04 / 401 * 1e6)  # $99.75
    assert cost.blended_usd_per_mtok == pytest.approx(0.06 / 1401 * 1e6)  # $42.83
    assert cost.utilisation == pytest.approx(3 / 60)
    assert gauge(metrics, "prompt") == pytest.approx(20.0)
    assert gauge(metrics, "blended") == pytest.approx(0.06 / 1401 * 1e6)
    assert metrics.registry.get_sample_value("ridgeline_usd_per_hour", {"model_name": "m"}) == 3.60


def test_only_time_the_server_and_recorder_cover_is_paid():
    # Serving began 20 s ago: the window is those 20 s ($0.02), all of it charged to the one prompt.
    started = priced([step(0, 995.0, 1.0, prompt_tokens=1000)], started=980.0).refresh_cost(now=1000.0)
    assert started.prompt_usd_per_mtok == pytest.approx(0.02 / 1000 * 1e6)
    # The ring buffer dropped older steps: the window starts where its oldest kept step began (990 s).
    dropped = priced([step(7, 991.0, 1.0, prompt_tokens=1000)], recorded=8).refresh_cost(now=1000.0)
    assert dropped.prompt_usd_per_mtok == pytest.approx(0.01 / 1000 * 1e6)


def test_an_idle_window_has_no_price_and_an_unpriced_server_no_gauge():
    idle = priced([])
    assert idle.refresh_cost(now=1000.0).blended_usd_per_mtok is None
    assert math.isnan(gauge(idle, "completion"))
    unpriced = ServerMetrics("m")
    assert unpriced.refresh_cost() is None and counters(unpriced)["cost"] is None
    assert b"ridgeline_usd_per" not in unpriced.render()


def test_a_served_request_shows_up_in_metrics_and_the_dashboard():
    with serve_tiny_model(usd_per_hour=2.0) as server:
        response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hello there", "max_tokens": 8,
                                                                     "ignore_eos": True}, timeout=60)
        assert response.status_code == 200, response.text
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        state = httpx.get(f"{server.url}/dashboard/state", timeout=30).json()
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
             if line.startswith("ridgeline_usd_per")}
    assert lines['ridgeline_usd_per_hour{model_name="' + state["workers"][0]["model"] + '"}'] == 2.0
    cost = state["counters"]["cost"]
    assert cost["usd_per_hour"] == 2.0 and cost["window_s"] == 60.0
    assert cost["prompt_usd_per_mtok"] > 0 and cost["completion_usd_per_mtok"] > 0
    assert 0 < cost["utilisation"] <= 1
