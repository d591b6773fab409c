"""The compiled kernels (csrc/quant_kernels.cpp): JIT-built once per machine on first use, with a torch fallback.

The build runs under a file lock (several processes may start at once; compiling takes ~1 min on 2 cores)
and lands in ~/.cache/ridgeline/torch_extensions. Without AVX-512 VNNI, without a compiler, or for
tensors off the CPU, the same operations run as plain torch code (dequantise, then matmul).
"""

import fcntl
import functools
import os
import warnings
from pathlib import Path
from types import ModuleType

import torch

from ridgeline.model.quant.packing import PackedWeight, dequantize_reference

CACHE_DIR = Path(os.environ.get("RIDGELINE_CACHE_DIR", Path.home() / ".cache" / "ridgeline"))
SOURCE = Path(__file__).resolve().parents[2] / "csrc" / "quant_kernels.cpp"
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma")
COMPILE_FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma"]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@functools.cache
def compiled() -> ModuleType | None:
    """The extension module, or None (with one warning) where it cannot run here."""
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in _cpu_flags()]
    if missing:
        return None  # a CPU without AVX-512 VNNI: the torch path is the supported route, no warning
    from torch.utils.cpp_extension import load

    build_dir = CACHE_DIR / "torch_extensions" / "quant_kernels"
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compile per machine; later processes just load the result
        try:
            return load(
                name="ridgeline_quant_kernels",
                sources=[str(SOURCE)],
                extra_cflags=COMPILE_FLAGS,
                extra_ldflags=["-fopenmp"],  # at::parallel_for is OpenMP: without it the loop runs on one thread
                build_directory=str(build_dir),
                verbose=False,
            )
        except (OSError, RuntimeError, ImportError) as error:  # no compiler / no ninja: stay correct, just slower
            warnings.warn(f"ridgeline: quantised kernels could not be built ({error}); using the torch fallback")
            return None


def uses_compiled_kernels(weight: PackedWeight) -> bool:
    return weight.quants.device.type == "cpu" and compiled() is not None


def gemv(weight: PackedWeight, x: torch.Tensor) -> torch.Tensor:
    """Memory-bound path: x [M, in] float32 -> [M, out] float32, weights streamed once, activations int8."""
    if not uses_compiled_kernels(weight):
        return x @ dequantize_reference(weight, x.dtype).T
    return compiled().gemv(int(weight.qtype), x, *weight.planes, weight.out_features)


def dequantize(weight: PackedWeight, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `rows` (default: all) of the weight as a dense [len(rows), in] tensor of `dtype`."""
    if not uses_compiled_kernels(weight) or dtype not in (torch.float32, torch.bfloat16):
        dense = dequantize_reference(weight, dtype)
        return dense if rows is None else dense[rows]
    index = torch.empty(0, dtype=torch.int64) if rows is None else rows.to(torch.int64)
    return compiled().dequantize(
        int(weight.qtype), *weight.planes, weight.out_features, weight.in_features, index, dtype == torch.bfloat16
    )
