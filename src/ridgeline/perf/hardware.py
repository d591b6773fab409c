"""The hardware catalogue (a versioned TOML file of public figures) plus `this-machine`, measured once and cached."""

import json
import os
import platform
import tomllib
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

import torch

from ridgeline.errors import RidgelineError
from ridgeline.perf import measure

THIS_MACHINE = "this-machine"
CACHE_FORMAT = 1  # bump when the measurement changes, so stale cache files are re-measured


@dataclass(frozen=True)
class Hardware:
    name: str
    title: str
    bandwidth: float  # bytes/s
    memory_bytes: float
    dense_flops: dict[str, float]  # FLOP/s per precision ("fp32", "bf16", ...)
    default_precision: str
    sources: dict[str, str] = field(default_factory=dict)

    def flops(self, precision: str | None = None) -> float:
        precision = precision or self.default_precision
        if precision not in self.dense_flops:
            known = ", ".join(sorted(self.dense_flops))
            raise RidgelineError(f"{self.name} has no {precision} FLOP/s figure (it has: {known})")
        return self.dense_flops[precision]

    def ridge_point(self, precision: str | None = None) -> float:
        """FLOP per byte at which a kernel stops being bandwidth-bound: peak FLOP/s / bandwidth."""
        return self.flops(precision) / self.bandwidth


@dataclass(frozen=True)
class Observation:
    """A published measurement the source documents quote (decode or prefill tokens/s on one machine)."""

    machine: str
    model: str
    weights: str
    phase: str  # "prefill" or "decode"
    tokens_per_s: float
    test: str
    source: str
    prompt_tokens: int | None = None


@cache
def _catalogue_data() -> dict:
    text = resources.files("ridgeline.perf").joinpath("hardware_catalogue.toml").read_text()
    return tomllib.loads(text)


def catalogue() -> dict[str, Hardware]:
    """Every catalogued machine by name (not `this-machine`, which is measured on demand)."""
    machines = {}
    for entry in _catalogue_data()["machine"]:
        machines[entry["name"]] = Hardware(
            name=entry["name"],
            title=entry["title"],
            bandwidth=entry["bandwidth_gb_s"] * 1e9,
            memory_bytes=entry["memory_gb"] * 1e9,
            dense_flops={precision: tflops * 1e12 for precision, tflops in entry["dense_tflops"].items()},
            default_precision=entry["default_precision"],
            sources=dict(entry["sources"]),
        )
    return machines


def catalogue_version() -> int:
    return _catalogue_data()["version"]


def observations() -> list[Observation]:
    return [Observation(**entry) for entry in _catalogue_data()["observation"]]


def hardware_names() -> list[str]:
    return [*catalogue(), THIS_MACHINE]


def get_hardware(name: str, remeasure: bool = False) -> Hardware:
    if name == THIS_MACHINE:
        return this_machine(remeasure=remeasure)
    machines = catalogue()
    if name not in machines:
        raise RidgelineError(f"unknown hardware {name!r} (known: {', '.join(hardware_names())})")
    return machines[name]


def cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ridgeline" / "this-machine.json"


def this_machine(remeasure: bool = False, threads: int | None = None) -> Hardware:
    """This machine's roofline, from the cache if it was measured here before with the same thread count."""
    threads = threads or torch.get_num_threads()
    identity = {"format": CACHE_FORMAT, "host": platform.node(), "cpu": _cpu_model(), "threads": threads}
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
    """Read bandwidth and bf16/fp32 GEMM FLOP/s with `threads` threads (a few seconds in all)."""
    flops = {
        "bf16": measure.measure_matmul_flops(torch.bfloat16, threads),
        "fp32": measure.measure_matmul_flops(torch.float32, threads),
    }
    source = f"measured by ridgeline with {threads} threads (torch {torch.__version__})"
    return Hardware(
        name=THIS_MACHINE,
        title=f"this machine ({_cpu_model()}, {threads} threads)",
        bandwidth=measure.measure_read_bandwidth(threads),
        memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        dense_flops=flops,
        # The faster precision is the one an engine on this machine would run its matmuls in.
        default_precision=max(flops, key=flops.get),
        sources={
            "bandwidth": f"{source}: STREAM-like sum over a {measure.READ_BUFFER_BYTES // 2**20} MiB buffer",
            "memory": "os.sysconf: physical memory",
            "flops": f"{source}: {measure.MATMUL_SIZE}x{measure.MATMUL_SIZE} GEMM",
        },
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
