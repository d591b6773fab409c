"""The engine core's process as the API process sees it: started with multiprocessing's spawn (a fresh
interpreter: nothing of the API process's threads or event loop is forked into it), ready once its model is
loaded, and stopped, killed or started again from here.

Each start binds a new pair of ipc:// sockets in a private directory: a message queued for a core that died is
dropped with its socket and never reaches the next one (ZeroMQ would hand it to whatever peer connects next).

AttachedCore is the same seen from one of several API processes (`serve --api-server-count N`), which did not
start the core and cannot restart it: their supervisor (api_servers.py) does. It watches the core through a pidfd
(the core is not its child) and drops what it had queued by binding its sockets afresh.
"""

import multiprocessing
import os
import select
import shutil
import signal
import tempfile
from dataclasses import dataclass

import zmq

from ridgeline.engine.admission import Admission
from ridgeline.engine.step_record import StepRecorder
from ridgeline.engine.structured.compiler import GrammarCompiler
from ridgeline.errors import RidgelineError
from ridgeline.server.engine_core.core import run_core
from ridgeline.server.engine_core.messages import CoreReady, EngineDead, decode

READY_SECONDS = 900.0  # loading a large model from a cold disk takes minutes; a core that dies says so at once
STOP_SECONDS = 10.0  # a core told to shut down that has not exited by then is killed


@dataclass(frozen=True)
class CoreSockets:
    inbound: str  # the core's PULL (the API process pushes Submit/Abort/Shutdown)
    outbound: str  # the core's PUSH (the API process pulls outputs and snapshots)


class CoreProcess:
    """One engine core at a time, and what the API process keeps of it across restarts: the tokenizer and the
    admission check (the same model's, whichever core serves), and a copy of the step records for the dashboard.

    It stands in for the engine where create_app reads one (model_name, tokenizer, admission, config, steps)."""

    owns_core = True  # this process started the core: it shuts it down and restarts it

    def __init__(self, config):
        self.config = config  # the EngineConfig the core builds its engine from
        self._context = zmq.Context()
        self._spawn = multiprocessing.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix="ridgeline-core-")
        self._generation = 0
        self.process: multiprocessing.Process | None = None
        self.push: zmq.Socket | None = None  # to the core
        self.pull: zmq.Socket | None = None  # from the core
        self.ready: CoreReady | None = None
        self.starts = 0

    # ------------------------------------------------------------ what create_app reads as the engine's

    @property
    def model_name(self) -> str:
        return self.ready.model_name

    @property
    def tokenizer(self):
        return self.ready.tokenizer

    @property
    def capacity_report(self) -> str:
        return self.ready.capacity_report

    def cached_prefix_tokens(self, prompt_token_ids: list[int]) -> int:
        raise RidgelineError("the prefix cache lives in the engine core's process: /v1/kv/lookup is not served with "
                             "--engine-core process")

    # ------------------------------------------------------------ life

    def start(self, timeout: float = READY_SECONDS) -> CoreReady:
        """Start a core and wait until its model is loaded; RidgelineError if it dies or does not say so in time."""
        self._generation += 1
        sockets = CoreSockets(f"ipc://{self._dir}/in-{self._generation}", f"ipc://{self._dir}/out-{self._generation}")
        self._bind(sockets)
        # daemon: should this process exit without stopping it (an exception on the way out), multiprocessing's exit
        # handler still ends it; a kill -9 of this process is caught by the core itself (its parent pid changes).
        self.process = self._spawn.Process(target=run_core, name="ridgeline-engine-core", daemon=True,
                                           args=(self.config, [(sockets.inbound, sockets.outbound)], os.getpid()))
        self.process.start()
        self.starts += 1
        ready = self._await_ready(timeout, self.process.sentinel)
        if ready is None:
            self.kill()
            raise RidgelineError(f"the engine core did not start (exit status {self.process.exitcode}); its error is "
                                 "above")
        return self._adopt(ready)

    def _bind(self, sockets: CoreSockets) -> None:
        self._close_sockets()
        self.push = self._context.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.bind(sockets.inbound)
        self.pull = self._context.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.bind(sockets.outbound)

    def _adopt(self, ready: CoreReady) -> CoreReady:
        if self.ready is None:
            self.ready = ready
            self.admission = Admission(ready.limits, ready.tokenizer, GrammarCompiler(ready.tokenizer, ready.vocab_size))
            self.steps = StepRecorder(ready.shape, ready.kv_dtype_bytes)
        elif ready.limits != self.ready.limits:  # the same config and model: a difference is a bug, not a restart
            self.kill()
            raise RidgelineError(f"the restarted engine core admits differently ({ready.limits} != {self.ready.limits})")
        return ready

    def _await_ready(self, timeout: float, *watched: int, dead_pid: int | None = None) -> CoreReady | None:
        """The core's CoreReady; None if it failed first, one of `watched` (a process sentinel, a wake-up pipe)
        became readable, or `timeout` passed. With `dead_pid` (waiting for the core after that one), whatever the
        dead core had sent is skipped, its EngineDead included."""
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        for fd in watched:
            poller.register(fd, zmq.POLLIN)
        waited = 0.0
        while waited < timeout:
            events = dict(poller.poll(500))
            waited += 0.5
            if self.pull in events:
                message = decode(self.pull.recv())
                if isinstance(message, CoreReady) and message.pid != dead_pid:
                    return message
                if isinstance(message, EngineDead) and dead_pid is None:
                    return None
            elif events:  # the sentinel: the process ended before it was ready (or a wake-up)
                return None
        return None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def sentinel(self) -> int:
        """Readable once the core's process has ended."""
        return self.process.sentinel

    def ended(self) -> str:
        """Why the core is gone, once `sentinel` said so."""
        self.process.join(1)  # reaped, so its exit status is known
        return f"its process ended, exit status {self.process.exitcode}"

    def send(self, frame: bytes) -> None:
        self.push.send(frame, copy=False)

    def join(self, timeout: float = STOP_SECONDS) -> None:
        """Wait for the core to exit (after a Shutdown); kill it if it has not by then."""
        if self.process is None:
            return
        self.process.join(timeout)
        if self.process.is_alive():
            self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(5)

    def close(self) -> None:
        self.kill()
        self._close_sockets()
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _close_sockets(self) -> None:
        for socket in (self.push, self.pull):
            if socket is not None:
                socket.close(linger=0)
        self.push = self.pull = None


class AttachedCore(CoreProcess):
    """One API process's side of a core that another process (the supervisor of several API processes) started
    and restarts. `start` binds this API process's socket pair and waits for the core, first or next, to say it is
    ready. On a restart only the socket to the core is bound afresh, dropping what was queued for the dead core: the
    supervisor may have started the next core before this process saw the last one die, and that core's CoreReady
    may already wait on the socket from the core, so that one is kept (and the dead core's leftovers skipped)."""

    owns_core = False  # Shutdown is the supervisor's to give (with SIGTERM, once every API process has drained)

    def __init__(self, config, sockets: CoreSockets):
        super().__init__(config)
        shutil.rmtree(self._dir, ignore_errors=True)  # the supervisor's directory holds the sockets
        self.sockets = sockets
        self.wake_fd: int | None = None  # readable when this process is stopping (CoreClient's): a wait ends then
        self._pid: int | None = None
        self._pidfd: int | None = None

    def start(self, timeout: float = READY_SECONDS) -> CoreReady:
        if self.pull is None:
            self._bind(self.sockets)
        else:
            self.push.close(linger=0)
            self.push = self._context.socket(zmq.PUSH)
            self.push.setsockopt(zmq.LINGER, 0)
            self.push.bind(self.sockets.inbound)
        ready = self._await_ready(timeout, *([self.wake_fd] if self.wake_fd is not None else []), dead_pid=self._pid)
        if ready is None:
            raise RidgelineError(f"no engine core said it was ready within {timeout:.0f} s (or this API process is "
                                 "stopping)")
        self._close_pidfd()
        self._pid = ready.pid
        try:
            self._pidfd = os.pidfd_open(ready.pid)
        except ProcessLookupError:  # ended already: the pidfd of a process gone would not say so, a pipe does
            read, self._pidfd = os.pipe()
            os.close(self._pidfd)
            self._pidfd = read
        self.starts += 1
        return self._adopt(ready)

    @property
    def alive(self) -> bool:
        if self._pidfd is None:
            return False
        return not select.select([self._pidfd], [], [], 0)[0]

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def sentinel(self) -> int:
        return self._pidfd

    def ended(self) -> str:
        return f"its process {self._pid} ended"

    def join(self, timeout: float = STOP_SECONDS) -> None:
        """Nothing to wait for: the supervisor stops the core once every API process has gone."""

    def kill(self) -> None:
        """As a crash would (tests, faults); the supervisor starts the next core."""
        if self.alive:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        self._close_pidfd()
        self._close_sockets()
        self._context.term()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
