"""`this-machine`: this machine's roofline, measured once per thread count and cached beside the kernel cache."""

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

import torch

from ridgeline.machine import measure
from ridgeline.machine.cpu import cpu_model
from ridgeline.napkin.hardware import THIS_MACHINE, Hardware

CACHE_FORMAT = 3  # bump when the measurement changes, so stale cache files are re-measured


def cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ridgeline" / "this-machine.json"


def this_machine(remeasure: bool = False, threads: int | None = None) -> Hardware:
    """This machine's roofline, from the cache if it was measured here before with the same thread count."""
    threads = threads or torch.get_num_threads()
    identity = {"format": CACHE_FORMAT, "host": platform.node(), "cpu": cpu_model(), "threads": threads}
    path = cache_path()
    if not remeasure and path.exists():
        cached = json.loads(path.read_text())
        if cached.get("identity") == identity:
            return Hardware(**cached["hardware"])
    hardware = measure_this_machine(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"identity": identity, "hardware": asdict(hardware)}, indent=2))
    return hardware


def measure_this_machine(threads: int) -> Hardware:
    """Read bandwidth, bf16/fp32 GEMM FLOP/s and the compiled kernels' int8 matmul ops/s with `threads` threads (a
    few seconds in all)."""
    flops = {
        "bf16": measure.measure_matmul_flops(torch.bfloat16, threads),
        "fp32": measure.measure_matmul_flops(torch.float32, threads),
    }
    # The faster float precision is the one an engine on this machine would run a float model's matmuls in.
    default_precision = max(flops, key=flops.get)
    source = f"measured by ridgeline with {threads} threads (torch {torch.__version__})"
    flops_source = f"{source}: {measure.MATMUL_SIZE}x{measure.MATMUL_SIZE} GEMM"
    # A GGUF model's quantised matmuls take the compiled int8 kernels instead (Hardware.matmul_precision); on this
    # 2-core Zen 4 VM they reached ~580-680 GOPS against bf16's ~350-415 GFLOP/s, so a roof of bf16 put the engine's
    # prompt steps above their ceiling.
    int8_ops = measure.measure_int8_matmul_ops(threads)
    if int8_ops is not None:
        flops["int8"] = int8_ops
        rows, (out, inputs) = measure.INT8_MATMUL_ROWS, measure.INT8_MATMUL_SHAPE
        flops_source += f"; int8: the compiled kernels' {rows} rows x Q8_0 {out}x{inputs} matmul"
    return Hardware(
        name=THIS_MACHINE,
        title=f"this machine ({cpu_model()}, {threads} threads)",
        bandwidth=measure.measure_read_bandwidth(threads),
        memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        dense_flops=flops,
        default_precision=default_precision,
        sources={
            "bandwidth": f"{source}: STREAM-like sum over a {measure.READ_BUFFER_BYTES // 2**20} MiB buffer, the best "
                         f"repetition over {measure.READ_BANDWIDTH_SECONDS:g} s",
            "memory": "os.sysconf: physical memory",
            "flops": flops_source,
        },
    )


def machine_named(name: str, threads: int | None = None) -> Hardware:
    """A catalogued machine by name, or this one (measured once, then cached) for THIS_MACHINE."""
    from ridgeline.napkin.hardware import catalogued

    return this_machine(threads=threads) if name == THIS_MACHINE else catalogued(name)
