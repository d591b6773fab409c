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
class Ownership:
    """How a machine one buys is priced per hour (the catalogue's [ownership] table)."""

    amortisation_years: float
    hours_per_year: float
    electricity_usd_per_kwh: float
    source: str

    def usd_per_hour(self, purchase_usd: float, power_w: float) -> float:
        return purchase_usd / (self.amortisation_years * self.hours_per_year) + power_w / 1000 * self.electricity_usd_per_kwh


@dataclass(frozen=True)
class Price:
    """What an hour of the machine costs, in US dollars, and where the figure came from. `kind` is "cloud" (an
    on-demand list price) or "owned" (purchase amortised plus power, under the catalogue's [ownership] terms)."""

    usd_per_hour: float
    source: str
    kind: str
    purchase_usd: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class Hardware:
    name: str
    title: str
    bandwidth: float  # bytes/s
    memory_bytes: float
    dense_flops: dict[str, float]  # FLOP/s per precision ("fp32", "bf16", ...; "int8": ops/s of int8 matmuls)
    default_precision: str  # the precision a model stored in floats runs its matmuls in
    sources: dict[str, str] = field(default_factory=dict)
    price: Price | None = None

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


def ownership() -> Ownership:
    terms = _catalogue_data()["ownership"]
    return Ownership(terms["amortisation_years"], terms["hours_per_year"], terms["electricity_usd_per_kwh"],
                     terms["source"])


def _price(entry: dict, where: str) -> Price:
    """A [machine.price] table: a cloud `usd_per_hour`, or `purchase_usd` and `power_w` priced by [ownership]."""
    if not entry.get("source"):
        raise RidgelineError(f"hardware catalogue: {where}'s price has no source")
    if "usd_per_hour" in entry:
        return Price(float(entry["usd_per_hour"]), entry["source"], "cloud")
    if "purchase_usd" in entry and "power_w" in entry:
        purchase, power = float(entry["purchase_usd"]), float(entry["power_w"])
        return Price(ownership().usd_per_hour(purchase, power), entry["source"], "owned", purchase, power)
    raise RidgelineError(f"hardware catalogue: {where}'s price needs usd_per_hour, or purchase_usd and power_w")


def this_machine_price() -> Price:
    """`this-machine` is measured, not catalogued; its price is catalogued all the same ([this_machine.price])."""
    return _price(_catalogue_data()["this_machine"]["price"], THIS_MACHINE)


def price_of(name: str) -> Price:
    """The hourly price of a catalogued machine or of `this-machine`."""
    if name == THIS_MACHINE:
        return this_machine_price()
    price = catalogued(name).price
    if price is None:
        raise RidgelineError(f"hardware {name!r} has no price in the catalogue; give one with --usd-per-hour")
    return price


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
            price=_price(entry["price"], entry["name"]) if "price" in entry else None,
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
