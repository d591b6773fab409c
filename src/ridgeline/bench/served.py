"""`ridgeline serve` as a child process on a free loopback port, for benchmark scripts that talk to it over HTTP."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_health(server: subprocess.Popen, url: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.02)
    raise RuntimeError(f"the server at {url} was not healthy within {timeout_s:.0f} s")


@contextlib.contextmanager
def ridgeline_server(*serve_args: str, env: dict[str, str] | None = None,
                     stderr=subprocess.DEVNULL) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (base URL, process) once /health answers 200; the server is stopped when the block ends."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "ridgeline"), "serve", "--port", str(port), *serve_args]
    server = subprocess.Popen(command, env=os.environ | (env or {}), stdout=subprocess.DEVNULL, stderr=stderr,
                              text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(server, url)
        yield url, server
    finally:
        server.terminate()
        server.wait(timeout=60)
