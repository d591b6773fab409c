"""A private virtual environment with llama-cpp-python, for benchmarks that compare against llama.cpp.

It is built once (pip compiles llama.cpp from source: many minutes on 2 cores) under the machine-wide CPU
lock, and never touches the project's own environment. `python benchmarks/llamacpp_env.py` builds it ahead of time.
"""

import os
from pathlib import Path

from private_venv import private_python

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the version that wrote shared/reference/
VENV_DIR = Path(__file__).resolve().parent / ".venv-llamacpp"
CPU_LOCK = Path("/tmp/ridgeline-cpu.lock")


def llamacpp_python() -> Path:
    """The environment's interpreter, building the environment first if it is missing."""
    env = os.environ | {"CMAKE_ARGS": "-DGGML_NATIVE=ON", "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    return private_python(VENV_DIR, LLAMA_CPP_PYTHON, "llama_cpp", CPU_LOCK, env, " (compiles llama.cpp; takes a while)")


if __name__ == "__main__":
    print(llamacpp_python())
