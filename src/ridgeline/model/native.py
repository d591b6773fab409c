"""ridgeline's compiled kernels (csrc/): JIT-built once per machine on first use.

The build runs under a file lock (several processes may start at once; compiling takes ~30 s on 2 cores)
and lands in ~/.cache/ridgeline/torch_extensions. Without AVX-512 VNNI or without a compiler `compiled()` is
None and every caller runs the same operation as plain torch code (as it does for tensors off the CPU).
"""

import fcntl
import functools
import os
import warnings
from pathlib import Path
from types import ModuleType

import torch

from ridgeline.startup_clock import phase

CACHE_DIR = Path(os.environ.get("RIDGELINE_CACHE_DIR", Path.home() / ".cache" / "ridgeline"))
CSRC = Path(__file__).resolve().parents[1] / "csrc"
SOURCES = [CSRC / name for name in ("bindings.cpp", "quant_kernels.cpp", "paged_attention.cpp", "layer_ops.cpp")]
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma")
COMPILE_FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                 "-mavx512vnni", "-mf16c", "-mfma"]


NO_TENSOR = torch.empty(0)  # an optional tensor argument left out (the kernels take tensors, not None)


def on_compiled_path(x: torch.Tensor, multiple: int) -> bool:
    """Whether a per-row float op on x runs compiled: fp32 on the CPU, last dim a multiple of `multiple`."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[-1] % multiple == 0 and compiled() is not None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def missing_cpu_flags() -> list[str]:
    """The flags the kernels need that this CPU lacks: empty where they can run here."""
    flags = _cpu_flags()
    return [flag for flag in REQUIRED_CPU_FLAGS if flag not in flags]


# Why the last build failed, where it did: a CPU that has the flags but no kernels is a fault the tests must
# report, not a machine to skip on, and they need the reason to say so.
build_error: str | None = None


@functools.cache
def compiled() -> ModuleType | None:
    """The extension module, or None (with one warning) where it cannot run here."""
    global build_error
    if missing_cpu_flags():
        return None  # a CPU without AVX-512 VNNI: the torch path is the supported route, no warning
    from torch.utils.cpp_extension import load

    build_dir = CACHE_DIR / "torch_extensions" / "kernels"
    build_dir.mkdir(parents=True, exist_ok=True)
    with phase("kernels"), open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compile per machine; later processes just load the result
        try:
            return load(
                name="ridgeline_kernels",
                sources=[str(source) for source in SOURCES],
                extra_cflags=COMPILE_FLAGS,
                extra_ldflags=["-fopenmp"],  # at::parallel_for is OpenMP: without it the loop runs on one thread
                build_directory=str(build_dir),
                verbose=False,
            )
        except (OSError, RuntimeError, ImportError) as error:  # no compiler / no ninja: stay correct, just slower
            build_error = f"{type(error).__name__}: {error}"
            warnings.warn(f"ridgeline: compiled kernels could not be built ({error}); using the torch fallback")
            return None
