"""`bench serve` against a real `ridgeline serve` app on loopback: the report is complete and its token counts are
the server's own (usage in each response, and the server's Prometheus counters)."""

import re

import httpx
from server_helpers import serve_tiny_model
from test_bench_serve import check_bench_serve


def metric(text: str, name: str) -> float:
    return float(re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.MULTILINE).group(1))


def test_bench_serve_against_ridgeline_serve():
    with serve_tiny_model() as server:
        report = check_bench_serve(server.url)
        metrics = httpx.get(f"{server.url}/metrics").text
    measured_output = sum(level["output_tokens"] for level in report["levels"])
    assert metric(metrics, "ridgeline_generation_tokens_total") == measured_output
    assert metric(metrics, "ridgeline_num_requests_running") == 0
