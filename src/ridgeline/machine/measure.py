"""Measure this machine's two roofline numbers: memory read bandwidth and dense matmul FLOP/s (float GEMMs by
torch, and the int8 matmul that quantised weights take on the compiled kernels).

Each measurement takes a few seconds at most: it repeats a short kernel until `seconds` have passed and keeps
the best repetition (the least disturbed by other processes on a shared machine).
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from gguf import GGMLQuantizationType

READ_BUFFER_BYTES = 256 * 2**20  # far larger than any last-level cache, so the sum streams from DRAM
# The read bandwidth's window. A ceiling is the best the machine does, and a shared VM's best comes and goes by the
# second: on the 2-core Zen 4 VM, four alternated pairs of windows read 32.4-50.0 GB/s over 0.5 s (one of four
# above 33) and 32.9-55.3 over 3 s (three of four above 52); twelve 0.5-s windows in a row read 27.1-38.5.
READ_BANDWIDTH_SECONDS = 3.0
MATMUL_SIZE = 1024
# The int8 matmul's shape: a prompt step's rows against a layer-sized Q8_0 weight (out x in)
INT8_MATMUL_ROWS, INT8_MATMUL_SHAPE = 256, (2048, 1024)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the body with `threads` intra-op threads (None: leave torch's setting alone)."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def best_seconds(kernel: Callable[[], object], device: torch.device, seconds: float, min_repeats: int = 3) -> float:
    """Fastest of repeated runs of `kernel` (after one warm-up run), repeating for about `seconds`."""
    kernel()
    _synchronize(device)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    repeats = 0
    while repeats < min_repeats or time.perf_counter() < deadline:
        start = time.perf_counter()
        kernel()
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
        repeats += 1
    return best


def measure_read_bandwidth(
    threads: int | None = None,
    nbytes: int = READ_BUFFER_BYTES,
    seconds: float = READ_BANDWIDTH_SECONDS,
    device: torch.device | str = "cpu",
) -> float:
    """Bytes/s read by a STREAM-like sum over a float32 buffer of `nbytes`, with `threads` torch threads: the best
    repetition over `seconds`."""
    device = torch.device(device)
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    with torch_threads(threads):
        elapsed = best_seconds(lambda: buffer.sum(), device, seconds)
    return buffer.numel() * buffer.element_size() / elapsed


def measure_matmul_flops(
    dtype: torch.dtype = torch.bfloat16,
    threads: int | None = None,
    size: int = MATMUL_SIZE,
    seconds: float = 0.5,
    device: torch.device | str = "cpu",
) -> float:
    """FLOP/s of a square `size` x `size` GEMM in `dtype` (2 * size**3 FLOPs per product)."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, generator=generator, device=device).to(dtype)
    b = torch.randn(size, size, generator=generator, device=device).to(dtype)
    with torch_threads(threads):
        elapsed = best_seconds(lambda: a @ b, device, seconds)
    return 2 * size**3 / elapsed


def measure_int8_matmul_ops(
    threads: int | None = None,
    rows: int = INT8_MATMUL_ROWS,
    shape: tuple[int, int] = INT8_MATMUL_SHAPE,
    seconds: float = 0.5,
) -> float | None:
    """Ops/s (2 per multiply-add) of the compiled kernels' matmul of `rows` float rows by a Q8_0 weight of `shape`:
    activations quantised to int8 and multiplied by int8 dot products, as a GGUF model's matmuls run on this
    machine. The bf16 and fp32 figures are torch's GEMMs; a quantised model's prompt never takes those. Q8_0 is the
    quantised type with the least per-block work beside the dot products, so this is the int8 ceiling as the engine
    reaches it. None where the compiled kernels do not run (quantised weights then take a float GEMM)."""
    from ridgeline.model.native import compiled
    from ridgeline.model.quant import kernels
    from ridgeline.model.quant.packing import pack
    from ridgeline.model.quant.random_blocks import random_stored

    if compiled() is None:
        return None
    weight = pack(random_stored(GGMLQuantizationType.Q8_0, shape))
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(0))
    with torch_threads(threads):
        elapsed = best_seconds(lambda: kernels.gemv(weight, x), torch.device("cpu"), seconds)
    return 2 * rows * shape[0] * shape[1] / elapsed


def measure_instruction_peaks(threads: int | None = None, seconds: float = 0.3) -> dict[str, float] | None:
    """The compiled kernels' ceilings on this machine now, every one of `threads` threads busy: the int8 ops/s of
    VPDPBUSD, the quantised matmuls' inner loop, and the fp32 FLOP/s of FMA, attention's (csrc/instruction_peaks.cpp).
    None where the kernels do not run. A shared VM's clock moves (one machine read 410 and 460 GOPS a core hours
    apart), so a kernel's rate means most against the peak taken in the same run."""
    from ridgeline.model.native import compiled

    kernels = compiled()
    if kernels is None:
        return None
    with torch_threads(threads):
        int8_ops, fp32_flops = kernels.instruction_peaks(seconds)
    return {"int8_ops_per_s": int8_ops, "fp32_flops_per_s": fp32_flops}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
