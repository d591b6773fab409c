"""The hardware catalogue: a versioned TOML file of public figures, with their sources.

`this-machine` is named here but not catalogued: it is measured (ridgeline/machine/this_machine.py), which needs
torch, and the napkin model stays plain arithmetic over figures it is given.
"""

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from ridgeline.errors import RidgelineError

THIS_MACHINE = "this-machine"


def matmul_precision(rates: dict[str, float], integer_weights: bool, float_precision: str) -> str:
    """The precision a model's matmuls run in on a machine with these measured `rates`: int8 for integer-quantised
    weights where the machine has an int8 figure (its engine multiplies the blocks without dequantising them), else
    `float_precision`."""
    return "int8" if integer_weights and "int8" in rates else float_precision


@dataclass(frozen=True)
class Hardware:
    name: str
    title: str
    bandwidth: float  # bytes/s
    memory_bytes: float
    dense_flops: dict[str, float]  # FLOP/s per precision ("fp32", "bf16", ...; "int8": ops/s of int8 matmuls)
    default_precision: str  # the precision a model stored in floats runs its matmuls in
    sources: dict[str, str] = field(default_factory=dict)

    def flops(self, precision: str | None = None) -> float:
        precision = precision or self.default_precision
        if precision not in self.dense_flops:
            known = ", ".join(sorted(self.dense_flops))
            raise RidgelineError(f"{self.name} has no {precision} FLOP/s figure (it has: {known})")
        return self.dense_flops[precision]

    def matmul_precision(self, integer_weights: bool) -> str:
        return matmul_precision(self.dense_flops, integer_weights, self.default_precision)

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
    text = resources.files("ridgeline.napkin").joinpath("hardware_catalogue.toml").read_text()
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


def catalogued(name: str) -> Hardware:
    """A catalogued machine by name (`this-machine` is measured: ridgeline.machine.this_machine)."""
    if name == THIS_MACHINE:
        raise RidgelineError(f"{THIS_MACHINE!r} is measured, not catalogued (ridgeline.machine.this_machine)")
    machines = catalogue()
    if name not in machines:
        raise RidgelineError(f"unknown hardware {name!r} (known: {', '.join(hardware_names())})")
    return machines[name]
