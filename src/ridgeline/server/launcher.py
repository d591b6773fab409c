"""Run the server: in the foreground for `ridgeline serve`, or on a background thread for tests and benchmarks."""

import asyncio
import gc
import logging
import signal
import threading
import time

import uvicorn
from fastapi import FastAPI

from ridgeline.server.app import ServerConfig
from ridgeline.server.slow_clients import REQUEST_READ_SECONDS, protocol_with_deadline


def configure_logging() -> None:
    """Our request lines on stderr beside uvicorn's own, one per request (uvicorn's access log stays off)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def freeze_startup_heap() -> None:
    """Take what start-up built, which lives as long as the process (the 262k-entry vocabulary, the model's
    modules...), out of the garbage collector's sight. A full collection otherwise walks those ~200k objects, ~110 ms
    on the default model here (measured) with the GIL held: a stall of whatever decode step it lands in. vLLM and
    SGLang freeze it too."""
    gc.collect()
    gc.freeze()


# After the app's own drain timeout has answered what is still running with an explicit error, uvicorn waits this
# much longer for those answers to go out before it cuts the connections left.
FLUSH_SECONDS = 2.0


class GracefulServer(uvicorn.Server):
    """uvicorn's server, with a shutdown that is graceful and can be cut short (issue 38):

    - the first SIGTERM/SIGINT stops accepting (the listener closes: no new connection) and tells the app
      (`app.state.begin_shutdown(grace)`, if it has one): a one-model server answers 503 to what still arrives on
      open connections, and what is still running after `grace` seconds gets an explicit error (a 503, or an
      error event ending its stream) and is aborted, its pages freed; clients that left were aborted already.
    - a second SIGTERM or SIGINT exits at once (uvicorn's own only takes a second SIGINT so).
    """

    def __init__(self, config: uvicorn.Config, grace: float):
        super().__init__(config)
        self.grace = grace

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if sockets is not None and self.started:
            # uvicorn says where it listens only on sockets it bound itself; each of several API processes sharing a
            # port (server/engine_core/api_servers.py) says it as uvicorn would, for whatever reads the log line.
            self._log_started_message(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        grace = self.grace
        if self.should_exit and sig in (signal.SIGTERM, signal.SIGINT):
            self.force_exit = True
            grace = 0.0  # the app's drain ends now too: what runs is told and aborted
        else:
            super().handle_exit(sig, frame)
        begin = getattr(getattr(self.config.app, "state", None), "begin_shutdown", None)
        if begin is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            loop.call_soon_threadsafe(begin, grace)


def serve_until_signalled(app: FastAPI, host: str, port: int, grace: float, sockets: list | None = None,
                          **options) -> None:
    """Serve until SIGTERM or SIGINT (GracefulServer); return after the shutdown. `sockets`: bound sockets to
    listen on instead of binding host:port (several API processes sharing one port)."""
    # uvicorn re-raises the signal it caught once it has shut down; ignoring SIGTERM by then makes that a clean exit.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    config = uvicorn.Config(app, host=host, port=port, access_log=False, log_level="info",
                            timeout_graceful_shutdown=grace + FLUSH_SECONDS, **options)
    GracefulServer(config, grace).run(sockets=sockets)


def run_server(app: FastAPI, config: ServerConfig, sockets: list | None = None) -> None:
    """Serve until SIGTERM or SIGINT: stop accepting, give in-flight requests drain_timeout to finish, answer the
    rest with an explicit error and abort them, stop the engine, return; a second signal exits at once."""
    freeze_startup_heap()
    serve_until_signalled(app, config.host, config.port, config.drain_timeout, sockets=sockets,
                          http=protocol_with_deadline(config.request_read_timeout),
                          limit_concurrency=config.max_connections)


class BackgroundServer:
    """`with BackgroundServer(app) as server:` serves app on a free loopback port at server.url until the block ends."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", drain_timeout: float = 5.0, startup_timeout: float = 60.0,
                 request_read_timeout: float = REQUEST_READ_SECONDS, max_connections: int | None = None):
        config = uvicorn.Config(
            app, host=host, port=0, access_log=False, log_level="warning", timeout_graceful_shutdown=drain_timeout,
            http=protocol_with_deadline(request_read_timeout), limit_concurrency=max_connections,
        )
        self.server = uvicorn.Server(config)
        self.startup_timeout = startup_timeout
        self._thread = threading.Thread(target=self.server.run, name="ridgeline-server", daemon=True)
        self.url = ""

    def __enter__(self) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *_) -> None:
        self.server.should_exit = True
        self._thread.join()
