"""ridgeline's compiled kernels (csrc/): JIT-built once per machine on first use.

The kernels are written against AVX-512 VNNI. A CPU with AVX2, FMA and F16C but no AVX-512 (AMD Zen 2/3, most
Intel client cores) builds the same sources with csrc/avx512_on_avx2.h standing in for the AVX-512 intrinsics.
The build runs under a file lock (several processes may start at once; compiling takes ~30 s on 2 cores)
and lands in ~/.cache/ridgeline/torch_extensions/<target>. Without AVX2 or without a compiler `compiled()` is
None and every caller runs the same operation as plain torch code (as it does for tensors off the CPU).
"""

import fcntl
import functools
import hashlib
import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from ridgeline.startup_clock import phase

CACHE_DIR = Path(os.environ.get("RIDGELINE_CACHE_DIR", Path.home() / ".cache" / "ridgeline"))
CSRC = Path(__file__).resolve().parents[1] / "csrc"
SOURCES = [CSRC / name for name in ("bindings.cpp", "quant_kernels.cpp", "paged_attention.cpp", "layer_ops.cpp",
                                     "decode_layer.cpp", "instruction_peaks.cpp")]


@dataclass(frozen=True)
class KernelTarget:
    """An instruction set the kernels build for: the CPU flags it needs and the compiler flags that select it."""

    name: str
    cpu_flags: tuple[str, ...]
    compile_flags: tuple[str, ...]


AVX512_VNNI = KernelTarget("avx512_vnni", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"),
                           ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma"))
AVX2 = KernelTarget("avx2", ("avx2", "f16c", "fma"), ("-mavx2", "-mf16c", "-mfma"))
TARGETS = (AVX512_VNNI, AVX2)  # best first
REQUIRED_CPU_FLAGS = AVX2.cpu_flags  # the least a CPU needs for any compiled kernels
# -ffp-contract=off: no fused multiply-adds but the written ones, so a row's bits do not depend on the compiler
COMMON_COMPILE_FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")


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


def kernel_target() -> KernelTarget | None:
    """The best instruction set this CPU builds the kernels for, or None."""
    flags = _cpu_flags()
    return next((target for target in TARGETS if all(flag in flags for flag in target.cpu_flags)), None)


# Why the last build failed, where it did: a CPU that has the flags but no kernels is a fault the tests must
# report, not a machine to skip on, and they need the reason to say so.
build_error: str | None = None


@functools.cache
def compiled() -> ModuleType | None:
    """The extension module, or None (with one warning) where it cannot run here."""
    global build_error
    target = kernel_target()
    if target is None:
        return None  # a CPU without AVX2: the torch path is the supported route, no warning
    build_dir = CACHE_DIR / "torch_extensions" / f"kernels_{target.name}"
    build_dir.mkdir(parents=True, exist_ok=True)
    with phase("kernels"):
        built = _load_finished_build(build_dir, target)
        if built is not None:
            return built
    from torch.utils.cpp_extension import load  # (imports setuptools: ~0.25 s a warm start does not need)

    with phase("kernels"), open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compile per machine; later processes just load the result
        # torch's load() takes its own lock, a plain file it deletes when done, even just to load a finished build. A
        # process killed inside load() (a worker a test kills while it starts) leaves that file behind, and every
        # later load() would wait for it forever. Holding the flock, nobody else is inside load(): any such file is
        # stale.
        (build_dir / "lock").unlink(missing_ok=True)
        try:
            module = load(
                name=f"ridgeline_kernels_{target.name}",
                sources=[str(source) for source in SOURCES],
                extra_cflags=[*COMMON_COMPILE_FLAGS, *target.compile_flags],
                extra_ldflags=["-fopenmp"],  # at::parallel_for is OpenMP: without it the loop runs on one thread
                build_directory=str(build_dir),
                verbose=False,
            )
        except (OSError, RuntimeError, ImportError) as error:  # no compiler / no ninja: stay correct, just slower
            build_error = f"{type(error).__name__}: {error}"
            warnings.warn(f"ridgeline: compiled kernels could not be built ({error}); using the torch fallback")
            return None
        (build_dir / BUILT_FROM).write_text(f"{_build_digest(target)} {Path(module.__file__).name}\n")
        return module


# Written beside a finished build: the digest of what it was built from and the library's file name. A later
# process that finds the same digest imports the library directly, without torch's builder (importing it costs a
# warm start ~0.25 s, and it re-hashes the sources and asks ninja whether anything changed).
BUILT_FROM = "ridgeline_built_from"


def _build_digest(target: KernelTarget) -> str:
    digest = hashlib.sha256(f"{target}|{COMMON_COMPILE_FLAGS}|{torch.__version__}".encode())
    for source in sorted(CSRC.iterdir()):  # headers too: a change to any of them is a new build
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def _load_finished_build(build_dir: Path, target: KernelTarget) -> ModuleType | None:
    try:
        digest, library = (build_dir / BUILT_FROM).read_text().split()
    except (OSError, ValueError):
        return None  # never built here, or built before the stamp existed: torch's builder decides
    path = build_dir / library
    if digest != _build_digest(target) or not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    if spec is None or spec.loader is None:
        return None
    try:
        module = importlib.util.module_from_spec(spec)  # (an extension module is opened here)
        spec.loader.exec_module(module)
    except ImportError:
        return None  # a library this torch cannot load: let the builder rebuild it
    return module
