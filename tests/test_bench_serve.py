"""`bench serve` against a small OpenAI-compatible streaming stub on a free loopback port.

`check_bench_serve(base_url)` is the reusable part: point it at any server (e.g. a real `ridgeline serve`
on loopback) and it checks the report's fields and that token counts are the server's own.
"""

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from typer.testing import CliRunner

from ridgeline.bench.bench_serve import BenchServeConfig, LoadLevel, bench_serve, check_target
from ridgeline.workload.serve_metrics import Slo
from ridgeline.cli import register_commands
from ridgeline.cli.app import app as cli_app
from ridgeline.errors import RidgelineError
from ridgeline.napkin.measured import parse_points

OUTPUT_LEN = 8


def check_bench_serve(base_url: str, model: str | None = None, endpoint: str = "completions") -> dict:
    """Run 4 requests at concurrency 1 and 2 against `base_url`; check the report; return it."""
    config = BenchServeConfig(base_url, model, endpoint, num_prompts=4, input_len=16, output_len=OUTPUT_LEN, max_seconds=60)
    done = []
    report = bench_serve(config, [LoadLevel(concurrency=1), LoadLevel(concurrency=2)], on_done=done.append)
    assert len(done) == 8 and all(r.ok for r in done), [r.error for r in done]
    for level in report["levels"]:
        assert (level["completed"], level["failed"]) == (4, 0)
        assert level["usage_reported"]  # counts are the server's, not ours
        assert level["output_tokens"] == 4 * OUTPUT_LEN  # ignore_eos asks for exactly output_len tokens
        assert level["request_throughput"] > 0 and level["output_tokens_per_s"] > 0
        for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            stats = level[metric]
            assert set(stats) == {"mean", "p50", "p90", "p99"}
            assert 0 <= stats["p50"] <= stats["p90"] <= stats["p99"]
        assert level["ttft_ms"]["mean"] <= level["e2e_ms"]["mean"]
    assert [p["batch"] for p in report["roofline_points"]] == [1, 2]
    parse_points(report)  # the JSON goes straight into `roofline --measured`
    json.dumps(report)  # and is JSON
    return report


# --- the stub server ----------------------------------------------------------------------------


def stub_app(send_usage: bool = True) -> FastAPI:
    """Streams max_tokens words, two per chunk on every third chunk (so chunks != tokens), then usage."""
    app = FastAPI()
    app.state.usage = []
    app.state.in_flight = app.state.peak_in_flight = 0
    app.state.hold_until_in_flight = 0  # >0: each request waits (up to 10 s) until this many are in flight

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}

    async def stream(body: dict, chat: bool):
        app.state.in_flight += 1
        app.state.peak_in_flight = max(app.state.peak_in_flight, app.state.in_flight)
        try:
            deadline = time.monotonic() + 10
            while app.state.in_flight < app.state.hold_until_in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            async for event in _events(body, chat):
                yield event
        finally:
            app.state.in_flight -= 1

    async def _events(body: dict, chat: bool):
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": body["max_tokens"]}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        sent = chunk = 0
        while sent < body["max_tokens"]:
            words = min(2 if chunk % 3 == 2 else 1, body["max_tokens"] - sent)
            text = "".join(f"w{sent + i} " for i in range(words))
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            sent, chunk = sent + words, chunk + 1
            await asyncio.sleep(0.002)
        app.state.usage.append(usage)
        if send_usage and body.get("stream_options", {}).get("include_usage"):
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        return StreamingResponse(stream(await request.json(), chat=False), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return StreamingResponse(stream(await request.json(), chat=True), media_type="text/event-stream")

    return app


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Run `app` with uvicorn in a thread on a free loopback port; yield its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[str, FastAPI]]:
    app = stub_app()
    with serving(app) as base_url:
        yield base_url, app


def test_report_fields_and_token_counts_equal_the_servers_usage(stub):
    base_url, app = stub
    app.state.usage.clear()
    report = check_bench_serve(base_url)
    served = app.state.usage
    assert len(served) == 8
    levels = report["levels"]
    assert sum(level["output_tokens"] for level in levels) == sum(u["completion_tokens"] for u in served)
    assert sum(level["prompt_tokens"] for level in levels) == sum(u["prompt_tokens"] for u in served)
    assert levels[0]["model"] == "stub-model"  # asked the server when --model was not given


def test_chat_endpoint_and_chunk_counting_when_the_server_sends_no_usage():
    app = stub_app(send_usage=False)
    with serving(app) as base_url:
        config = BenchServeConfig(base_url, "stub-model", "chat", num_prompts=3, input_len=4, output_len=9)
        done = []
        report = bench_serve(config, [LoadLevel(concurrency=3)], on_done=done.append)
    (level,) = report["levels"]
    assert not level["usage_reported"]
    # 9 tokens in chunks of 1, 1, 2, 1, 1, 2, 1: the fallback counts 7 chunks per request.
    assert [r.chunks for r in done] == [7, 7, 7] and level["output_tokens"] == 21
    assert all(r.text.split() == [f"w{i}" for i in range(9)] for r in done)


def test_poisson_arrivals_and_goodput_against_slos(stub):
    base_url, _ = stub
    config = BenchServeConfig(base_url, num_prompts=6, input_len=8, output_len=4, slo=Slo(ttft_ms=60_000, itl_ms=0.001))
    report = bench_serve(config, [LoadLevel(request_rate=50.0)])
    (level,) = report["levels"]
    assert level["load"] == {"concurrency": None, "request_rate": 50.0}
    assert level["completed"] == 6
    assert level["good_requests"] == 0 and level["goodput"] == 0  # nobody streams at 1 microsecond per token
    assert report["roofline_points"] == []  # an arrival rate says nothing about the batch size
    lenient = bench_serve(BenchServeConfig(base_url, num_prompts=2, output_len=4, slo=Slo(ttft_ms=60_000)), [LoadLevel(1)])
    assert lenient["levels"][0]["goodput"] == lenient["levels"][0]["request_throughput"]


def test_time_limit_cancels_what_is_still_running():
    app = stub_app()
    with serving(app) as base_url:
        config = BenchServeConfig(base_url, "stub-model", num_prompts=3, output_len=5000, max_seconds=1)
        (level,) = bench_serve(config, [LoadLevel(concurrency=1)])["levels"]
    assert level["completed"] == 0 and level["failed"] == 3
    assert level["errors"] == ["cancelled at the time limit"]


def test_remote_targets_are_refused_unless_allowed():
    for url in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"):
        check_target(url, allow_remote=False)
    with pytest.raises(RidgelineError, match="not a loopback address: pass --allow-remote"):
        check_target("http://10.1.2.3:8000", allow_remote=False)
    with pytest.raises(RidgelineError, match="not a loopback"):
        check_target("https://api.example.com", allow_remote=False)
    check_target("https://api.example.com", allow_remote=True)
    with pytest.raises(RidgelineError, match="must look like"):
        check_target("127.0.0.1:8000", allow_remote=False)


def test_cli_prints_json_and_writes_both_plots(stub, tmp_path):
    base_url, _ = stub
    register_commands()
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("\n".join(json.dumps({"prompt": f"hello number {i}", "max_tokens": 3}) for i in range(5)))
    args = ["bench", "serve", "--base-url", base_url, "--concurrency", "1,2", "--num-prompts", "4", "--dataset", str(dataset),
            "--slo-ttft-ms", "10000", "--json", "--plot", str(tmp_path / "serve")]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [level["load"]["concurrency"] for level in report["levels"]] == [1, 2]
    assert all(level["output_tokens"] == 4 * 3 for level in report["levels"])
    for name in ("serve-latency.png", "serve-throughput.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    refused = CliRunner().invoke(cli_app, ["bench", "serve", "--base-url", "http://192.0.2.1:8000"])
    assert isinstance(refused.exception, RidgelineError)


def test_record_writes_a_trace_that_replays_and_simulates(stub, tmp_path):
    from ridgeline.workload.trace import read_trace
    from ridgeline.sim.workload import from_trace, poisson_arrivals

    base_url, _ = stub
    path = tmp_path / "trace.jsonl"
    bench_serve(BenchServeConfig(base_url, num_prompts=3, input_len=5, output_len=4, record=path), [LoadLevel(request_rate=20.0)])
    rows = read_trace(path)
    # The simulator draws the same Poisson arrivals for the same seed, and reads the recorded lengths.
    assert [r.arrival_s for r in rows] == pytest.approx(poisson_arrivals(20.0, 3, seed=0), abs=1e-6)
    assert [(r.output_tokens, r.prompt_tokens, len(r.prompt.split())) for r in rows] == [(4, 5, 5)] * 3
    assert [len(r.prompt_ids) for r in from_trace(rows, vocab_size=100).requests] == [5, 5, 5]
    replay = bench_serve(BenchServeConfig(base_url, trace=path), [LoadLevel()])
    (level,) = replay["levels"]
    assert (level["completed"], level["output_tokens"], level["prompt_tokens"]) == (3, 12, 15)
    with pytest.raises(RidgelineError, match="drop --request-rate"):
        bench_serve(BenchServeConfig(base_url, trace=path), [LoadLevel(request_rate=1.0)])


def test_a_trace_replays_every_request_at_its_arrival_without_a_concurrency_cap(stub, tmp_path):
    """Without --concurrency, four requests arriving together are in flight together (the stub holds each until
    all four are: sent one at a time, the first would wait out its 10 s and the peak would be 1)."""
    from ridgeline.cli.bench_serve import load_levels
    from ridgeline.workload.trace import TraceRequest, read_trace, write_trace

    base_url, app = stub
    trace = write_trace(tmp_path / "burst.jsonl", [TraceRequest(0.0, 4, None, f"w{i} w{i}", None) for i in range(4)])
    levels = load_levels(None, None, trace=True)
    assert levels == [LoadLevel()] and load_levels("2", None, trace=True) == [LoadLevel(concurrency=2)]
    app.state.peak_in_flight, app.state.hold_until_in_flight = 0, 4
    try:
        started = time.monotonic()
        report = bench_serve(BenchServeConfig(base_url, trace=trace, record=tmp_path / "sent.jsonl"), levels)
        assert time.monotonic() - started < 10  # nobody waited out the stub's hold
    finally:
        app.state.hold_until_in_flight = 0
    assert app.state.peak_in_flight == 4
    (level,) = report["levels"]
    assert level["completed"] == 4 and level["load"] == {"concurrency": None, "request_rate": None}
    # Recorded as sent: each at its arrival (a cap that held one back would record when it went out).
    assert [row.arrival_s for row in read_trace(tmp_path / "sent.jsonl")] == [0.0] * 4
    capped = tmp_path / "capped.jsonl"
    bench_serve(BenchServeConfig(base_url, trace=trace, record=capped), [LoadLevel(concurrency=1)])
    sent = [row.arrival_s for row in read_trace(capped)]
    assert sent[0] == 0.0 and all(later > 0 for later in sent[1:])  # held back by the cap: recorded when sent
