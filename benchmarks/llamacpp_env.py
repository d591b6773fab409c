"""A private virtual environment with llama-cpp-python, for benchmarks that compare against llama.cpp.

It is built once (pip compiles llama.cpp from source: many minutes on 2 cores) under the machine-wide CPU
lock, and never touches the project's own environment. `python benchmarks/llamacpp_env.py` builds it ahead of time.
"""

import fcntl
import os
import subprocess
import sys
import venv
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the version that wrote shared/reference/
VENV_DIR = Path(__file__).resolve().parent / ".venv-llamacpp"
CPU_LOCK = Path("/tmp/ridgeline-cpu.lock")


def llamacpp_python() -> Path:
    """The environment's interpreter, building the environment first if it is missing."""
    python = VENV_DIR / "bin" / "python"
    if _has_llama_cpp(python):
        return python
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _has_llama_cpp(python):  # someone else may have built it while we waited
            print(f"building {LLAMA_CPP_PYTHON} into {VENV_DIR} (compiles llama.cpp; takes a while)", file=sys.stderr)
            venv.create(VENV_DIR, with_pip=True, clear=True)
            (VENV_DIR / ".gitignore").write_text("*\n")
            env = os.environ | {"CMAKE_ARGS": "-DGGML_NATIVE=ON", "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
            subprocess.run([python, "-m", "pip", "install", "--no-cache-dir", LLAMA_CPP_PYTHON], check=True, env=env)
    return python


def _has_llama_cpp(python: Path) -> bool:
    return python.exists() and subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode == 0


if __name__ == "__main__":
    print(llamacpp_python())
