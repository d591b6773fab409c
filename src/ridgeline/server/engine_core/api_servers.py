"""`ridgeline serve --engine-core process --api-server-count N`: N API processes (HTTP, validation, tokenising, chat
templates, admission, tenants, streaming) in front of one engine-core process, all on one port.

The process `serve` runs in becomes their supervisor and answers nothing itself:

- It reserves the port (a socket bound with SO_REUSEPORT that never listens), and each API process binds the same
  port with SO_REUSEPORT and listens: the kernel spreads new connections over the listening sockets by a hash of
  each connection's addresses, so no process accepts for the others and none wakes for a connection it will not get.
- It starts the core (core.py) with one pair of ipc:// sockets per API process, and the API processes, each with
  its own client of the core (AttachedCore under CoreClient). The core sends a request's outputs back on the pair
  its Submit came in on, and every step's snapshot to all of them.
- It restarts the core when it dies (the budget of a one-API-process server: MAX_RESTARTS in RESTART_WINDOW). Each
  API process sees the death on its pidfd of the core, ends what it had in flight with 503 `engine_dead`, and takes
  requests again once the new core says it is ready.
- SIGTERM or Ctrl-C: forwarded as SIGTERM to every API process, each of which drains as a one-process server does;
  once they have all exited, the core is ended (SIGTERM: nothing is in flight then). A second signal is forwarded
  too (each API process then exits at once). SIGHUP (the tenants file's reload) is forwarded.
- An API process that exits by itself (a crash, or a core it gave up on) takes the whole server down with exit
  status 1, for whatever supervises `serve` to restart it whole; so does a core that keeps dying. Should this
  process be killed outright, the core and the API processes see their parent change and exit.
- Metrics: every API process's /metrics is the whole server's (server/metrics.py). Before starting them it points
  PROMETHEUS_MULTIPROC_DIR at an empty directory of this server's (so no count survives from another run), for
  them alone: the core writes no metrics, and a restarted core changes nothing there (the counts are the API
  processes', which live on). When an API process ends, its mirrored gauges are dropped (mark_process_dead); its
  counters' and histograms' files stay, so the totals never go back.
"""

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import wait

from prometheus_client.multiprocess import mark_process_dead

from ridgeline.errors import RidgelineError
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.engine_core.client import MAX_RESTARTS, RESTART_WINDOW
from ridgeline.server.engine_core.core import run_core
from ridgeline.server.engine_core.process import STOP_SECONDS, AttachedCore, CoreSockets
from ridgeline.server.launcher import FLUSH_SECONDS, configure_logging, run_server
from ridgeline.server.metrics import MULTIPROC_DIR_ENV

log = logging.getLogger("ridgeline.api_servers")

PARENT_POLL_SECONDS = 0.5  # how often an API process looks whether its supervisor is still there


@dataclass(frozen=True)
class ApiServerSpec:
    """What one API process is started with (pickled into it)."""

    engine_config: object  # the core's EngineConfig (what create_app reads as the engine's config)
    server_config: ServerConfig  # with this process's api_server_index and the count, and the port reserved
    sockets: CoreSockets  # its pair to the core
    parent_pid: int  # the supervisor's


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEPORT (not listening: asyncio's create_server listens)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise RidgelineError(f"cannot bind {host}:{port}: {error}") from None
    return sock


def run_api_server(spec: ApiServerSpec) -> None:
    """An API process's entry point (multiprocessing, spawn): wait for the core, then serve until SIGTERM."""
    # A process group of its own: Ctrl-C on a terminal reaches the supervisor alone, which forwards one SIGTERM;
    # a SIGINT here as well would count as the second signal and cut the drain short.
    os.setpgrp()
    configure_logging()
    config = spec.server_config
    core = AttachedCore(spec.engine_config, spec.sockets)
    core.start()
    if config.api_server_index == 0:
        log.info("engine core: process %d; %s", core.pid, core.capacity_report)
    app = create_app(core, config)
    threading.Thread(target=_exit_with_parent, args=(spec.parent_pid,), name="ridgeline-parent-watch",
                     daemon=True).start()
    run_server(app, config, sockets=[reuseport_socket(config.host, config.port)])


def _exit_with_parent(parent_pid: int) -> None:
    """The supervisor gone (kill -9): drain and exit as on SIGTERM (its core exits by itself, the same way)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)


class ApiServers:
    """The supervisor: one engine core and `count` API processes, started, watched and stopped together."""

    def __init__(self, engine_config, server_config: ServerConfig, count: int):
        if count < 2:
            raise RidgelineError(f"several API processes means 2 or more, got {count}")
        self.engine_config = engine_config
        self.server_config = server_config
        self.count = count
        self._spawn = multiprocessing.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix="ridgeline-api-servers-")
        self.sockets = [CoreSockets(f"ipc://{self._dir}/in-{i}", f"ipc://{self._dir}/out-{i}") for i in range(count)]
        self.metrics_dir = os.path.join(self._dir, "metrics")  # the API processes' PROMETHEUS_MULTIPROC_DIR
        os.mkdir(self.metrics_dir)
        self._metrics_dropped: set[int] = set()
        self.core: multiprocessing.Process | None = None
        self.api: list[multiprocessing.Process] = []
        self.restarts: list[float] = []
        self._stopping = False

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (0) or a failure that took the server down (1)."""
        reserved = reuseport_socket(self.server_config.host, self.server_config.port)
        config = replace(self.server_config, port=reserved.getsockname()[1], api_server_count=self.count)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, lambda *_: self._forward(signal.SIGHUP))
        try:
            self._start_core()
            self._start_api_processes(config)
            log.info("%d API processes (pids %s) on %s:%d, engine core pid %d", self.count,
                     ", ".join(str(p.pid) for p in self.api), config.host, config.port, self.core.pid)
            return self._supervise()
        finally:
            self._begin_stop()
            deadline = time.monotonic() + config.drain_timeout + FLUSH_SECONDS + STOP_SECONDS
            for process in self.api:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():  # past its own drain and flush: stuck
                    log.error("API process %s did not stop: killed", process.name)
                    process.kill()
                    process.join(5)
            self._stop_core()
            reserved.close()
            shutil.rmtree(self._dir, ignore_errors=True)

    def _start_api_processes(self, config: ServerConfig) -> None:
        """Each with the shared metrics directory in its environment from its first line (prometheus-client reads
        it at import); it is taken out of this process's again, so a restarted core never has it."""
        previous = os.environ.get(MULTIPROC_DIR_ENV)
        os.environ[MULTIPROC_DIR_ENV] = self.metrics_dir
        try:
            for index, sockets in enumerate(self.sockets):
                spec = ApiServerSpec(self.engine_config, replace(config, api_server_index=index), sockets, os.getpid())
                process = self._spawn.Process(target=run_api_server, args=(spec,), name=f"ridgeline-api-{index}",
                                              daemon=True)
                process.start()
                self.api.append(process)
        finally:
            if previous is None:
                os.environ.pop(MULTIPROC_DIR_ENV)
            else:
                os.environ[MULTIPROC_DIR_ENV] = previous

    def _drop_metrics_of_ended(self) -> None:
        """An ended API process's mirrored gauges no longer count (its counters and histograms do: kept)."""
        for process in self.api:
            if process.exitcode is not None and process.pid not in self._metrics_dropped:
                self._metrics_dropped.add(process.pid)
                mark_process_dead(process.pid, self.metrics_dir)

    def _supervise(self) -> int:
        status = 0
        while True:
            running = [p for p in self.api if p.is_alive()]
            if not running:
                return status
            watched = [p.sentinel for p in running]
            if not self._stopping and self.core.is_alive():
                watched.append(self.core.sentinel)
            wait(watched, timeout=0.5)  # a signal lands between waits: the handler only sets a flag and forwards
            self._drop_metrics_of_ended()
            if self._stopping:
                continue
            ended = [p for p in self.api if not p.is_alive()]
            if ended:
                log.error("API process %s ended (exit status %s): stopping the server", ended[0].name,
                          ended[0].exitcode)
                status = 1
                self._begin_stop()
            elif not self.core.is_alive() and not self._restart_core():
                status = 1
                self._begin_stop()

    def _start_core(self) -> None:
        # The core connects to each API process's sockets; it may come up before they are bound (ZeroMQ connects
        # when they are) and is ready in each once that one has its CoreReady.
        endpoints = [(s.inbound, s.outbound) for s in self.sockets]
        self.core = self._spawn.Process(target=run_core, name="ridgeline-engine-core", daemon=True,
                                        args=(self.engine_config, endpoints, os.getpid()))
        self.core.start()

    def _restart_core(self) -> bool:
        self.core.join(1)
        log.error("engine core (pid %s) died, exit status %s", self.core.pid, self.core.exitcode)
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW] + [now]
        if len(self.restarts) > MAX_RESTARTS:
            log.error("the engine core died %d times in %.0f s: stopping the server", len(self.restarts),
                      RESTART_WINDOW)
            return False
        self._start_core()
        log.info("engine core restarted (pid %d)", self.core.pid)
        return True

    def _on_stop_signal(self, signum, frame) -> None:
        if self._stopping:
            self._forward(signal.SIGTERM)  # the second: each API process exits at once, as one server would
        self._begin_stop()

    def _begin_stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._forward(signal.SIGTERM)

    def _forward(self, signum: int) -> None:
        for process in self.api:
            if process.exitcode is None and process.pid is not None:
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass

    def _stop_core(self) -> None:
        """Every API process has gone, so nothing is in flight: the core is simply ended."""
        if self.core is None:
            return
        if self.core.is_alive():
            self.core.terminate()
            self.core.join(STOP_SECONDS)
        if self.core.is_alive():
            self.core.kill()
            self.core.join(5)
