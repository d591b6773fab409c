"""llama.cpp's own C++ tools, `llama-server` and `llama-bench`, for benchmarks that compare ridgeline against them.

They are compiled once from the llama.cpp vendored in the llama-cpp-python sdist that wrote shared/reference/ (many
minutes on 2 cores) under the machine-wide CPU lock, into benchmarks/.llamacpp-tools/. Linked statically, so the
binaries alone are kept. `python benchmarks/llamacpp_tools.py` builds them ahead of time and prints their paths.
"""

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from llamacpp_env import CPU_LOCK, LLAMA_CPP_PYTHON

TOOLS_DIR = Path(__file__).resolve().parent / ".llamacpp-tools"
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary; the source tree is thrown away after the build
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # would fetch the web UI from a model hub; the benchmark needs only the API
    "-DLLAMA_CURL=OFF",
]


TOOLS = ("llama-server", "llama-bench")  # built together: one configure, and the second costs little more


def llama_server() -> Path:
    """The `llama-server` binary, building the tools first if it is missing."""
    return llama_tool("llama-server")


def llama_bench() -> Path:
    """The `llama-bench` binary (llama.cpp's pp/tg figures), building the tools first if it is missing."""
    return llama_tool("llama-bench")


def llama_tool(name: str) -> Path:
    if name not in TOOLS:
        raise ValueError(f"{name!r} is not one of the llama.cpp tools built here ({', '.join(TOOLS)})")
    binary = TOOLS_DIR / "bin" / name
    if binary.exists():
        return binary
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():  # someone else may have built it while we waited
            _build([tool for tool in TOOLS if not (TOOLS_DIR / "bin" / tool).exists()])
    return binary


def _build(tools: list[str]) -> None:
    print(f"building {', '.join(tools)} from the {LLAMA_CPP_PYTHON} sdist into {TOOLS_DIR} (takes a while)",
          file=sys.stderr)
    started = time.monotonic()
    TOOLS_DIR.mkdir(exist_ok=True)
    (TOOLS_DIR / ".gitignore").write_text("*\n")
    with tempfile.TemporaryDirectory(prefix="llamacpp-src-") as work:
        work = Path(work)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
                        LLAMA_CPP_PYTHON, "-d", work], check=True)
        (sdist,) = work.glob("*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        (source,) = work.glob("*/vendor/llama.cpp")
        build = work / "build"
        subprocess.run([_cmake(), "-S", source, "-B", build, *CMAKE_OPTIONS], check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run([_cmake(), "--build", build, "--target", *tools, "-j", jobs], check=True)
        (TOOLS_DIR / "bin").mkdir(exist_ok=True)
        for tool in tools:  # the temporary directory may be on another disk
            shutil.move(build / "bin" / tool, TOOLS_DIR / "bin" / tool)
    print(f"built {', '.join(tools)} in {time.monotonic() - started:.0f} s", file=sys.stderr)


def _cmake() -> str:
    """The project environment's cmake if it has one, else the system's."""
    bundled = Path(sys.executable).parent / "cmake"
    return str(bundled) if bundled.exists() else "cmake"


if __name__ == "__main__":
    for tool in TOOLS:
        print(llama_tool(tool))
