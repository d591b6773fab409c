"""Chat templates from model files render in a worker process, bounded in time and memory (see template_worker.py).

One worker per process, started on first use and kept: a render costs a pipe round trip (well under a
millisecond), not a process start. A render that overruns RENDER_SECONDS gets the worker killed and a clear
error; the next render starts a fresh worker. Renders are serialised, as the one worker does one at a time.
"""

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path

from ridgeline.errors import RidgelineError

WORKER_FILE = Path(__file__).with_name("template_worker.py")
RENDER_SECONDS = 2.0  # a real template renders a long chat in milliseconds
START_SECONDS = 60.0  # a fresh interpreter importing jinja2, on a loaded machine


class ChatTemplateError(RidgelineError):
    """The model's chat template failed, overran its time or memory, or asked for something the sandbox refuses."""


class TemplateWorker:
    def __init__(self, render_seconds: float = RENDER_SECONDS):
        self.render_seconds = render_seconds
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._pending = b""

    def render(self, source: str, context: dict) -> str:
        try:
            job = json.dumps({"source": source, "context": context}).encode() + b"\n"
        except (TypeError, ValueError) as error:
            raise ChatTemplateError(f"chat template input is not JSON-like: {error}") from None
        with self._lock:
            process = self._running()
            try:
                process.stdin.write(job)
                process.stdin.flush()
            except OSError:
                self._stop()
                raise ChatTemplateError("chat template failed: the template worker stopped") from None
            line = self._read_line(process, self.render_seconds)
            if not line:
                self._stop()
                if line is None:
                    raise ChatTemplateError(f"chat template failed: rendering took longer than {self.render_seconds:g} s")
                raise ChatTemplateError("chat template failed: the template worker stopped while rendering")
        reply = json.loads(line)
        if "error" in reply:
            raise ChatTemplateError(f"chat template failed: {reply['error']}")
        return reply["text"]

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._stop()
        self._process = subprocess.Popen(
            [sys.executable, str(WORKER_FILE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        if not self._read_line(self._process, START_SECONDS):
            self._stop()
            raise ChatTemplateError("chat template failed: the template worker did not start")
        return self._process

    def _read_line(self, process: subprocess.Popen, seconds: float) -> bytes | None:
        """The next reply line; None if none came within `seconds`, b"" if the worker died."""
        deadline = time.monotonic() + seconds
        fd = process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b""  # end of file: the worker is gone (crashed, or killed by the kernel)
                self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _stop(self) -> None:
        self._pending = b""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for stream in (self._process.stdin, self._process.stdout):
                stream.close()
            self._process = None


_worker = TemplateWorker()
atexit.register(_worker.close)


def render_untrusted(source: str, context: dict) -> str:
    return _worker.render(source, context)
