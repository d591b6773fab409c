"""Failover through the router's OpenAI endpoint, streamed and not: a request goes to another replica only when it
surely had not started generating on the first (no connection to it; an engine worker that produced nothing);
otherwise it ends with an explicit 502 (or, once a stream is under way, an error event) and runs nowhere else."""

import json
import socket
import threading
import time

import httpx
import pytest

from cluster_helpers import TEST_RATES, local_group
from test_router_server import answering_app
from ridgeline.cluster.http_replica import HttpReplica
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.server.launcher import BackgroundServer
from ridgeline.server.router_app import create_router_app


class DyingBackend:
    """An OpenAI server killed on the job, over a raw socket: it answers /health, and a POST it reads whole, then
    ("drop") closes the connection with no answer, as a server killed mid-generation does before a non-streaming
    answer's headers, or ("stream") first sends a stream's headers and one event. `stop()` closes the port: a
    server that is gone before a request reaches it."""

    def __init__(self, mode: str):
        self.mode = mode
        self.posts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # stopped
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection: socket.socket) -> None:
        with connection:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += connection.recv(65536)
            if head.startswith(b"GET"):
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                                   b"connection: close\r\n\r\n{}")
                return
            self.posts += 1
            if self.mode == "stream":
                event = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":" a"}]}\n\n'
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                   b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % len(event) + event + b"\r\n")
            time.sleep(0.1)  # generating, then killed

    def stop(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept; a bare close leaves the port listening
        self.listener.close()


def routed(groups_of, on_built=None):
    """A router app over the groups `groups_of()` makes (in the server's loop), as a BackgroundServer; the built
    router lands in `on_built`."""
    async def build() -> Router:
        groups = groups_of()
        rates = {r.name: Rates(*TEST_RATES, "configured") for g in groups for r in g.replicas}
        router = Router(groups, rates, health_interval_s=3600, learn_rates=False)
        await router.start()
        if on_built is not None:
            on_built["router"] = router
        return router

    return BackgroundServer(create_router_app(build))


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_backend_that_had_the_request_and_died_is_a_502_never_a_rerun(stream):
    dying, live_calls, built = DyingBackend("drop"), [], {}
    with BackgroundServer(answering_app(live_calls, reprefills=None)) as live, \
            routed(lambda: [ModelGroup("m", 0.5, [HttpReplica("m/0", "m", dying.url),
                                                  HttpReplica("m/1", "m", live.url)])], built) as server:
        body = {"model": "m", "prompt": "the fox", "max_tokens": 4, "stream": stream}
        answer = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert answer.status_code == 502 and answer.json()["error"]["code"] == "backend_failed"
        assert "not re-sent" in answer.json()["error"]["message"]
        assert dying.posts == 1 and live_calls == []  # run once, where it was sent
        router = built["router"]
        assert not router.health["m/0"].up
        assert router.metrics.failovers.labels("m", "m/0")._value.get() == 0
        # the next request goes to the live replica
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200
        assert len(live_calls) == 1
    dying.stop()


def test_an_openai_backend_gone_before_the_request_reached_it_is_failed_over():
    gone, live_calls = DyingBackend("drop"), []
    with BackgroundServer(answering_app(live_calls, reprefills=None)) as live, \
            routed(lambda: [ModelGroup("m", 0.5, [HttpReplica("m/0", "m", gone.url),
                                                  HttpReplica("m/1", "m", live.url)])]) as server:
        gone.stop()  # up at the router's first health check, then gone: the connection is refused
        for stream in (False, True):
            answer = httpx.post(server.url + "/v1/completions",
                                json={"model": "m", "prompt": "x", "max_tokens": 1, "stream": stream}, timeout=30)
            assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == " ok"
        assert gone.posts == 0 and len(live_calls) == 2


def test_an_openai_stream_cut_midway_ends_with_an_error_event_and_runs_nowhere_else():
    dying, live_calls = DyingBackend("stream"), []
    with BackgroundServer(answering_app(live_calls, reprefills=None)) as live, \
            routed(lambda: [ModelGroup("m", 0.5, [HttpReplica("m/0", "m", dying.url),
                                                  HttpReplica("m/1", "m", live.url)])]) as server:
        answer = httpx.post(server.url + "/v1/completions",
                            json={"model": "m", "prompt": "x", "max_tokens": 8, "stream": True}, timeout=30)
        sent = events(answer.text)
        assert answer.status_code == 200 and sent[0]["choices"][0]["text"] == " a"
        assert sent[-1]["error"]["code"] == "backend_failed" and answer.text.rstrip().endswith("data: [DONE]")
        assert dying.posts == 1 and live_calls == []
    dying.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_worker_killed_mid_generation_ends_the_request_explicitly(stream):
    """Killed once the request's first token came: a 502 (non-streaming) or the tokens so far then an error event
    (streaming); the other replica never runs it. A worker already dead when the request comes is passed over."""
    holder, built = {}, {}

    def groups():
        holder["group"] = local_group("m", replicas=2)
        return [holder["group"]]

    with routed(groups, built) as server:
        router, replicas = built["router"], holder["group"].replicas
        result = {}
        body = {"model": "m", "prompt": [5] * 16, "max_tokens": 480, "ignore_eos": True, "temperature": 0,
                "stream": stream}
        sender = threading.Thread(target=lambda: result.update(
            answer=httpx.post(server.url + "/v1/completions", json=body, timeout=60)))
        sender.start()
        deadline = time.monotonic() + 30
        while not any(router.loads.of(r.name).num_decoding for r in replicas) and time.monotonic() < deadline:
            time.sleep(0.001)
        victim = next(r for r in replicas if router.loads.of(r.name).num_decoding)
        other = next(r for r in replicas if r is not victim)
        victim.kill("test killed the worker")
        sender.join(60)
        answer = result["answer"]
        if stream:
            sent = events(answer.text)
            assert answer.status_code == 200 and sent[-1]["error"]["code"] == "backend_failed"
            assert 1 <= len(sent) - 1 < 480
        else:
            assert answer.status_code == 502 and answer.json()["error"]["code"] == "backend_failed"
            assert "test killed the worker" in answer.json()["error"]["message"]
        assert router.loads.of(other.name).sent == 0  # not re-run
        # The router has not probed since: a request now finds the dead worker refusing before any work and goes on.
        again = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 4, "stream": False}, timeout=60)
        assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 4
        assert router.loads.of(other.name).sent == 1
