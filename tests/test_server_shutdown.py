"""Shutdown: `ridgeline serve` on SIGTERM stops accepting connections, lets in-flight streams finish and exits
with 0; what is still running at the drain timeout is aborted and its KV blocks freed."""

import asyncio
import json
import signal
import time

import httpx
import pytest

from server_helpers import serve_tiny_model_process, tiny_engine

from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.launcher import BackgroundServer


@pytest.fixture
def serve_process():
    with serve_tiny_model_process("--drain-timeout", "30") as served:
        yield served


def refuses_connections_soon(url: str, seconds: float = 30) -> bool:
    """The server stops listening at its next tick after the signal (0.1 s; later on a loaded machine): poll for
    that rather than sleep a guess and look once. A connection caught as the listener closes may be dropped
    unanswered: that one is asked again."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=5)
        except httpx.ConnectError:
            return True
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    return False


def test_sigterm_drains_in_flight_requests_then_exits_cleanly(serve_process):
    process, url = serve_process
    body = {"prompt": "the quick brown fox", "max_tokens": 400, "ignore_eos": True, "stream": True}
    chunks, finish, done = 0, None, False
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line.removeprefix("data: "))
                finish = chunk["choices"][0]["finish_reason"] or finish
                chunks += 1
                if chunks == 1:
                    process.send_signal(signal.SIGTERM)
                    assert refuses_connections_soon(url)  # no new connections while draining...
                    assert process.poll() is None  # ...refused by the draining server, not because it had exited
    assert done and finish == "length"
    assert process.wait(timeout=30) == 0
    log = process.stderr.read()
    request_lines = [json.loads(line.split("ridgeline.server.requests: ", 1)[1]) for line in log.splitlines()
                     if "ridgeline.server.requests: " in line]
    assert len(request_lines) == 1 and request_lines[0]["completion_tokens"] == 400
    assert "prompt" not in request_lines[0] and "quick brown" not in log  # no prompt text by default


def test_past_the_drain_timeout_in_flight_requests_are_aborted_and_free_their_blocks():
    engine = tiny_engine()
    background = BackgroundServer(create_app(engine, ServerConfig(drain_timeout=0.5)), drain_timeout=0.5)
    streams, max_tokens = 16, 480  # far more work than fits in the drain timeout

    async def scenario(url: str) -> list[str | None]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            started = asyncio.Barrier(streams + 1)

            async def stream(i: int) -> str | None:
                body = {"prompt": f"stream {i}", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
                finish, first = None, True
                try:
                    async with client.stream("POST", "/v1/completions", json=body) as response:
                        async for line in response.aiter_lines():
                            if first:
                                first = False
                                await started.wait()
                            if line.startswith("data: {"):
                                finish = json.loads(line.removeprefix("data: "))["choices"][0]["finish_reason"] or finish
                except httpx.RemoteProtocolError:
                    pass  # the server cut the stream at the drain timeout
                return finish

            tasks = [asyncio.create_task(stream(i)) for i in range(streams)]
            await started.wait()
            background.server.should_exit = True  # what SIGTERM does
            return await asyncio.gather(*tasks)

    with background:
        finishes = asyncio.run(scenario(background.url))
    assert finishes.count("length") < streams  # some were cut short...
    stats = engine.stats()  # ...and the engine let go of all of them
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_free_pages == stats.num_total_pages


def test_serving_takes_the_startup_heap_out_of_the_garbage_collectors_sight(monkeypatch):
    """A full collection walks every tracked object: on the default model ~200k built at start-up, ~110 ms with the
    GIL held, a stall of the decode step it lands in. The server freezes them before it serves."""
    import gc

    from ridgeline.server import launcher
    from ridgeline.server.app import ServerConfig

    frozen_when_serving = []
    monkeypatch.setattr(launcher.signal, "signal", lambda *args: None)
    monkeypatch.setattr(launcher.GracefulServer, "run", lambda *args, **kwargs: frozen_when_serving.append(gc.get_freeze_count()))
    built_at_startup = [[index] for index in range(1000)]  # container objects, tracked by the collector
    try:
        launcher.run_server(object(), ServerConfig())
        assert gc.is_tracked(built_at_startup[0])
        assert frozen_when_serving and frozen_when_serving[0] >= len(built_at_startup)
    finally:
        gc.unfreeze()
