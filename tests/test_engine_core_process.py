"""`--engine-core process`: the engine steps in a child process driven over ZeroMQ (server/engine_core/), behind
the same HTTP server. Greedy outputs equal the in-process engine's; a client that leaves frees everything; a
killed core fails what was in flight with an explicit 503 / error event and comes back; no core outlives serve."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from server_helpers import KV_BYTES_PER_TOKEN, serve_tiny_model, serve_tiny_model_process, tiny_model_path

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.engine_core.process import CoreProcess
from ridgeline.server.launcher import BackgroundServer

PROMPTS = ["The quick brown fox", "Once upon a time there was", "a cache and a server"]


@contextlib.contextmanager
def serve_tiny_core():
    """The tiny model's server (as serve_tiny_model builds it) with its engine in a core process: (server, core)."""
    config = EngineConfig(
        model=str(tiny_model_path()),
        kv_cache=KVCacheConfig(block_size=16, dtype="fp32", memory_bytes=256 * 16 * KV_BYTES_PER_TOKEN),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=1024),
    )
    core = CoreProcess(config)
    core.start()
    app = create_app(core, ServerConfig())
    with BackgroundServer(app) as server:
        server.app = app
        yield server, core
    assert not core.alive  # the server's shutdown stopped it


@pytest.fixture(scope="module")
def core_server():
    with serve_tiny_core() as running:
        yield running


@pytest.fixture(scope="module")
def thread_client():
    with serve_tiny_model() as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def front(server):
    return server.app.state.serving.engine


def answers(client: openai.OpenAI) -> list:
    model = client.models.list().data[0].id
    out = []
    for prompt in PROMPTS:
        whole = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stream=True)
        out.append((whole.choices[0].text, whole.usage.completion_tokens, "".join(c.choices[0].text for c in stream)))
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[0]}],
                                          max_tokens=16, temperature=0)
    out.append(chat.choices[0].message.content)
    return out


def test_greedy_output_identical_to_thread_mode(core_server, thread_client):
    server, _ = core_server
    assert answers(client_of(server)) == answers(thread_client)


def test_structured_output_through_the_core(core_server):
    server, _ = core_server
    client = client_of(server)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    reply = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": "a number"}], max_tokens=40,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert isinstance(json.loads(reply.choices[0].message.content)["n"], int)


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_client_leaving_frees_everything(core_server):
    server, _ = core_server
    engine = front(server)
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30,
                      json={"prompt": "The quick", "max_tokens": 400, "ignore_eos": True, "stream": True}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    # The core applied the abort and its final output came back: nothing in flight on either side, every page free.
    assert wait_for(lambda: engine.driver.in_flight == 0 and engine.num_submissions == 0)
    assert wait_for(lambda: engine.snapshot.stats.num_running == 0 and engine.snapshot.stats.num_waiting == 0)
    stats = engine.snapshot.stats
    assert stats.num_free_pages == stats.num_total_pages
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'ridgeline_requests_client_left_total{model_name="tiny-llama"} 1.0' in metrics


def test_killed_core_fails_in_flight_explicitly_then_recovers(core_server):
    server, core = core_server
    engine, url = front(server), server.url
    events: list[str] = []
    stream_started = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=30,
                          json={"prompt": "Once", "max_tokens": 450, "ignore_eos": True, "stream": True}) as reply:
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    events.append(line)
                    stream_started.set()

    whole: list[httpx.Response] = []
    streamer = threading.Thread(target=stream)
    waiter = threading.Thread(target=lambda: whole.append(httpx.post(
        f"{url}/v1/completions", json={"prompt": "Twice", "max_tokens": 450, "ignore_eos": True}, timeout=30)))
    streamer.start()
    waiter.start()
    assert stream_started.wait(10) and wait_for(lambda: engine.driver.in_flight == 2)
    old_pid = core.pid
    killed = time.monotonic()
    os.kill(old_pid, signal.SIGKILL)
    streamer.join(5)
    waiter.join(5)
    assert time.monotonic() - killed < 1.5, "in-flight requests must end at once, not hang"
    errors = [json.loads(line[5:])["error"] for line in events if '"error"' in line]
    assert errors and errors[0]["code"] == "engine_dead" and events[-1] == "data: [DONE]"
    assert whole[0].status_code == 503 and whole[0].json()["error"]["code"] == "engine_dead"
    # Restarted: healthy again, a new process, and it answers.
    assert wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, 30)
    assert core.pid != old_pid
    client = client_of(server)
    # ignore_eos: a sampled end token from the random model would end it early (a 1-in-hundreds CI flake).
    reply = client.completions.create(model=client.models.list().data[0].id, prompt="again", max_tokens=4,
                                      extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 4


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def core_pid_of(process) -> int:
    """The serve process's engine core: its child running the core (multiprocessing also starts a resource tracker)."""
    for pid in children(process.pid):
        with contextlib.suppress(FileNotFoundError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes() and b"resource_tracker" not in \
                    Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError(f"no engine core among {children(process.pid)}")


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie has exited
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_no_orphan_core_after_serve_ends(how):
    with serve_tiny_model_process("--engine-core", "process", "--drain-timeout", "1") as (process, url):
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        core = core_pid_of(process)
        process.send_signal(how)
        process.wait(30)
        assert wait_for(lambda: gone(core), 5), "the engine core outlived its server"


@pytest.mark.parametrize("args", [["--role", "prefill"], ["--decode-workers", "1", "--prefill-workers", "1"],
                                  ["--engine-core", "fork"], ["--engine-core", "thread", "--api-server-count", "2"]])
def test_unsupported_combinations_are_refused(args):
    options = ["--engine-core", "process", *args] if args[0] != "--engine-core" else args
    result = subprocess.run([sys.executable, "-c", "from ridgeline.cli import main; main()", "serve",
                             str(tiny_model_path()), *options], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--engine-core" in result.stderr, result.stderr


def test_a_core_that_cannot_restart_shuts_the_server_down(tmp_path):
    """Killed, and its model gone since: the restart fails, so the client gives up (a server sends itself SIGTERM)
    instead of answering 503 for ever; what was in flight still ended with engine_dead."""
    from dataclasses import replace

    from ridgeline.server.engine_core.client import CoreClient

    model = tmp_path / "model.gguf"
    model.write_bytes(tiny_model_path().read_bytes())
    core = CoreProcess(EngineConfig(model=str(model), kv_cache=KVCacheConfig(dtype="fp32", memory_bytes=1 << 20)))
    core.start()
    gave_up = threading.Event()
    client = CoreClient(core, 8, deliver=lambda deliveries: None, on_snapshot=lambda *_: None,
                        give_up=gave_up.set).start()
    try:
        core.config = replace(core.config, model=str(tmp_path / "gone.gguf"))
        core.kill()
        assert gave_up.wait(60)
        assert not client.alive and "could not be restarted" in client.error
    finally:
        client.stop()
