"""`this-machine`: this machine's roofline, measured by `ridgeline measure` and cached per thread count.

One cache file holds an entry per (host, CPU, thread count), so measuring with 1 thread never evicts the entry for 2.
An entry keeps its provenance (when, how many threads, how many rounds, each figure's spread across the rounds),
and every figure drawn from it says so (Hardware.title). Reading the cache never measures (`cached`); measuring is
asked for (`measure_and_cache`, or `this_machine` by the commands that are themselves measurements). A process that
only draws a roof (the dashboard, the router's priors) reads `roof_named`: the cached entry, else a napkin estimate
titled NOT MEASURED (`unmeasured`), never a measurement at its start.

A shared VM's figures move by the second, and a process measuring beside a busy one reads far less than the machine
does (three `serve` starts that measured beside the engine's KV page fault-in read int8 peaks of 673, 53.8 and
67.3 GOPS). So a measurement runs ROUNDS rounds, keeps each figure's best (a ceiling: disturbance only slows a
kernel down) and records the spread; and a measurement that reads worse than the cached entry does not replace it
unless forced: the cached entry stays, and the caller is told why.
"""

import fcntl
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ridgeline.machine.cpu import cpu_model
from ridgeline.napkin.hardware import THIS_MACHINE, Hardware

CACHE_FORMAT = 4  # bump when the measurement changes, so entries of the old one are no longer read
ROUNDS = 3
ROUND_SECONDS = {"bandwidth": 1.5, "matmul": 0.25}  # each round's windows: ~7 s for the three rounds
NOISY_SPREAD = 0.25  # a figure whose rounds differ by more than this share of its best: the machine was busy
WORSE = 0.9  # a new measurement below this share of a cached figure does not replace it unless forced
STALE_DAYS = 90


@dataclass(frozen=True)
class Provenance:
    measured_at: float  # Unix time
    threads: int
    rounds: int
    spread: dict[str, float]  # per figure ("bandwidth", "bf16", ...): (best - worst) / best across the rounds
    torch_version: str

    @property
    def noisy(self) -> bool:
        return max(self.spread.values(), default=0.0) > NOISY_SPREAD

    def stale(self, now: float | None = None) -> bool:
        import torch

        age_days = ((now or time.time()) - self.measured_at) / 86400
        return age_days > STALE_DAYS or self.torch_version != torch.__version__

    def describe(self) -> str:
        """When, with how many threads, how steady; and a flag where the entry should be measured again."""
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.measured_at))
        worst = max(self.spread, key=self.spread.get) if self.spread else None
        text = f"measured {when}, {self.threads} thread{'s' * (self.threads != 1)}, best of {self.rounds} rounds"
        if worst is not None:
            text += f", spread up to {self.spread[worst]:.0%} ({worst})"
        flags = []
        if self.noisy:
            flags.append("NOISY: the machine was busy; measure again on a quiet one")
        if self.stale():
            flags.append(f"STALE: older than {STALE_DAYS} days or another torch build")
        if flags:
            text += f"; {'; '.join(flags)} (`ridgeline measure --threads {self.threads} --force`)"
        return text


@dataclass(frozen=True)
class MachineEntry:
    """One thread count's measurement: the roofline figures, their provenance, and every round's reading."""

    hardware: Hardware
    provenance: Provenance
    samples: dict[str, list[float]]

    def to_json(self) -> dict:
        return {"hardware": asdict(self.hardware), "provenance": asdict(self.provenance), "samples": self.samples}

    @classmethod
    def from_json(cls, data: dict) -> "MachineEntry":
        provenance = Provenance(**data["provenance"])
        hardware = Hardware(**data["hardware"])
        # The title carries the provenance, so every figure drawn for this machine says when and how it was measured.
        hardware = replace(hardware, title=_title(provenance))
        return cls(hardware, provenance, data["samples"])

    def figures(self) -> dict[str, float]:
        return {"bandwidth": self.hardware.bandwidth, **self.hardware.dense_flops}


@dataclass(frozen=True)
class MeasureOutcome:
    kept: MachineEntry  # what the cache holds now, and what callers should use
    measured: MachineEntry  # this run's reading (the same as `kept` where it replaced the entry)
    replaced: bool
    note: str  # one line for the user: what was measured and what happened to the cached entry


def cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    # Not the file of format 3 and before (this-machine.json, one entry): an older ridgeline beside this one would
    # overwrite every entry here with its one.
    return base / "ridgeline" / "this-machine-by-threads.json"


def entry_key(threads: int) -> str:
    return f"{platform.node()} | {cpu_model()} | {threads} threads"


def default_threads(threads: int | None) -> int:
    import torch

    return threads or torch.get_num_threads()


def cached(threads: int | None = None) -> MachineEntry | None:
    """The cached entry for this host, CPU and thread count, or None. Never measures."""
    data = _read(cache_path())
    entry = data.get(entry_key(default_threads(threads)))
    return MachineEntry.from_json(entry) if entry else None


def cached_entries() -> list[MachineEntry]:
    """Every entry cached for this host and CPU, by thread count."""
    prefix = entry_key(0).rsplit("|", 1)[0]
    data = _read(cache_path())
    entries = [MachineEntry.from_json(value) for key, value in data.items() if key.startswith(prefix)]
    return sorted(entries, key=lambda entry: entry.provenance.threads)


def measure_and_cache(threads: int | None = None, force: bool = False) -> MeasureOutcome:
    """Measure now (ROUNDS rounds) and cache the entry, unless it reads worse than the cached one for the same thread
    count and `force` is not given: that entry then stays, and the outcome's note says so."""
    threads = default_threads(threads)
    measured = measure_this_machine(threads)
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # The lock spans the read, the comparison and the write: two processes caching at once each keep the other's
    # entries, and a worse reading cannot slip in between another's check and its write.
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _read(path)
        key = entry_key(threads)
        previous = MachineEntry.from_json(data[key]) if key in data else None
        lower = _lower_figures(measured, previous) if previous is not None else []
        if lower and not force:
            note = (f"kept the cached entry ({previous.provenance.describe()}): this run read "
                    f"{', '.join(lower)}; the machine is probably busy (`--force` replaces it)")
            return MeasureOutcome(previous, measured, False, note)
        data[key] = measured.to_json()
        _write(path, data)
    note = f"cached: {_summary(measured)}" + (f" (replaced {_summary(previous)})" if previous else "")
    return MeasureOutcome(measured, measured, True, note)


def this_machine(remeasure: bool = False, threads: int | None = None) -> Hardware:
    """This machine's roofline for `threads`: the cached entry, else measured now and cached. For the commands that
    are themselves measurements (roofline, bench, simulate); `serve` only reads the cache (`cached`)."""
    entry = None if remeasure else cached(threads)
    return entry.hardware if entry is not None else measure_and_cache(threads).kept.hardware


def measure_this_machine(threads: int, rounds: int = ROUNDS) -> MachineEntry:
    """Read bandwidth, bf16/fp32 GEMM FLOP/s and the compiled kernels' int8 matmul ops/s with `threads` threads,
    `rounds` times over; each figure is its best round, its spread the gap to its worst."""
    import torch

    from ridgeline.machine import measure

    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        # Round by round rather than figure by figure, so a burst of load elsewhere lowers one round of every figure
        # instead of every round of one.
        readings = {
            "bandwidth": measure.measure_read_bandwidth(threads, seconds=ROUND_SECONDS["bandwidth"]),
            "bf16": measure.measure_matmul_flops(torch.bfloat16, threads, seconds=ROUND_SECONDS["matmul"]),
            "fp32": measure.measure_matmul_flops(torch.float32, threads, seconds=ROUND_SECONDS["matmul"]),
            # A GGUF model's quantised matmuls take the compiled int8 kernels (Hardware.matmul_precision); on the
            # 2-core Zen 4 VM they reached ~580-680 GOPS against bf16's ~350-415 GFLOP/s, so a roof of bf16 put the
            # engine's prompt steps above their ceiling. None where the kernels do not run.
            "int8": measure.measure_int8_matmul_ops(threads, seconds=ROUND_SECONDS["matmul"]),
        }
        for figure, value in readings.items():
            if value is not None:
                samples.setdefault(figure, []).append(value)
    best = {figure: max(values) for figure, values in samples.items()}
    flops = {precision: best[precision] for precision in ("bf16", "fp32", "int8") if precision in best}
    provenance = Provenance(
        measured_at=time.time(), threads=threads, rounds=rounds,
        spread={figure: (max(values) - min(values)) / max(values) for figure, values in samples.items()},
        torch_version=torch.__version__,
    )
    source = f"measured by ridgeline with {threads} threads (torch {torch.__version__}), best of {rounds} rounds"
    flops_source = f"{source}: {measure.MATMUL_SIZE}x{measure.MATMUL_SIZE} GEMM"
    if "int8" in flops:
        rows, (out, inputs) = measure.INT8_MATMUL_ROWS, measure.INT8_MATMUL_SHAPE
        flops_source += f"; int8: the compiled kernels' {rows} rows x Q8_0 {out}x{inputs} matmul"
    hardware = Hardware(
        name=THIS_MACHINE,
        title=_title(provenance),
        bandwidth=best["bandwidth"],
        memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        dense_flops=flops,
        # The faster float precision is the one an engine on this machine would run a float model's matmuls in.
        default_precision=max(("bf16", "fp32"), key=flops.get),
        sources={
            "bandwidth": f"{source}: STREAM-like sum over a {measure.READ_BUFFER_BYTES // 2**20} MiB buffer, the best "
                         f"repetition over {ROUND_SECONDS['bandwidth']:g} s a round",
            "memory": "os.sysconf: physical memory",
            "flops": flops_source,
        },
    )
    return MachineEntry(hardware, provenance, samples)


def machine_named(name: str, threads: int | None = None) -> Hardware:
    """A catalogued machine by name, or this one (cached, else measured now) for THIS_MACHINE."""
    from ridgeline.napkin.hardware import catalogued

    return this_machine(threads=threads) if name == THIS_MACHINE else catalogued(name)


def roof_named(name: str, threads: int | None = None) -> Hardware:
    """The roof a long-running process draws (the dashboard, the router's rate priors): a catalogued machine, or
    this one as `ridgeline measure` cached it for `threads`, else its napkin estimate, titled NOT MEASURED. Never
    measures: a start-up measurement costs seconds and, beside the process's own start-up work, reads the machine
    far below its best (three such starts read int8 peaks of 673, 53.8 and 67.3 GOPS)."""
    from ridgeline.napkin.hardware import catalogued

    if name != THIS_MACHINE:
        return catalogued(name)
    entry = cached(threads)
    return entry.hardware if entry is not None else unmeasured(threads)


# The napkin's figures for a CPU nobody measured, per core (thread) unless said otherwise. Rough on purpose, and
# labelled so wherever they are drawn: a roof to read shapes against, not a ceiling to compare figures with.
NAPKIN_HZ = 3.0e9  # a typical all-core clock
NAPKIN_FMA_PER_CYCLE = 2  # two FMA pipes
NAPKIN_BANDWIDTH_PER_CORE = 10e9  # bytes/s one core's loads can keep in flight from DRAM
NAPKIN_BANDWIDTH_CAP = 60e9  # dual-channel DDR5's order of magnitude: more cores do not add more past it


def unmeasured(threads: int | None = None) -> Hardware:
    """This machine's napkin roof for `threads` where no measurement is cached: from the CPU's vector width (its
    flags), a typical clock and DRAM's usual order, every figure's source and the title saying it is not measured
    and how to measure it."""
    from ridgeline.machine.cpu import cpu_flags

    threads = default_threads(threads)
    flags = cpu_flags()
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4  # fp32 lanes of one vector register
    fp32 = threads * NAPKIN_HZ * NAPKIN_FMA_PER_CYCLE * lanes * 2
    flops = {"fp32": fp32, "bf16": 2 * fp32 if "avx512_bf16" in flags else fp32}
    if "avx2" in flags and "fma" in flags:  # the compiled int8 kernels run here (model/native.py)
        flops["int8"] = (4 if "avx512_vnni" in flags else 2) * fp32  # int8 dot products per fp32 FMA lane
    measure_it = f"`ridgeline measure --threads {threads}` measures it"
    napkin = f"NOT MEASURED, napkin estimate for {threads} thread{'s' * (threads != 1)}"
    return Hardware(
        name=THIS_MACHINE,
        title=f"this machine ({cpu_model()}; {napkin}; {measure_it})",
        bandwidth=min(NAPKIN_BANDWIDTH_CAP, threads * NAPKIN_BANDWIDTH_PER_CORE),
        memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        dense_flops=flops,
        default_precision=max(("bf16", "fp32"), key=flops.get),
        sources={
            "bandwidth": f"{napkin}: {NAPKIN_BANDWIDTH_PER_CORE / 1e9:g} GB/s a core, at most "
                         f"{NAPKIN_BANDWIDTH_CAP / 1e9:g} GB/s; {measure_it}",
            "memory": "os.sysconf: physical memory",
            "flops": f"{napkin}: {NAPKIN_HZ / 1e9:g} GHz x {NAPKIN_FMA_PER_CYCLE} FMA x {lanes} fp32 lanes x 2 a core "
                     f"(bf16 twice that with avx512_bf16; int8 x4 with VNNI, x2 with AVX2); {measure_it}",
        },
    )


def _title(provenance: Provenance) -> str:
    return f"this machine ({cpu_model()}; {provenance.describe()})"


def _lower_figures(new: MachineEntry, old: MachineEntry) -> list[str]:
    """The figures `new` reads below WORSE x `old`'s, as 'bandwidth 14.3 GB/s (cached 18.4)'."""
    old_figures = old.figures()
    return [f"{figure} {_format(figure, value)} (cached {_format(figure, old_figures[figure])})"
            for figure, value in new.figures().items()
            if figure in old_figures and value < WORSE * old_figures[figure]]


def _summary(entry: MachineEntry) -> str:
    figures = ", ".join(f"{figure} {_format(figure, value)}" for figure, value in entry.figures().items())
    return f"{figures} ({entry.provenance.describe()})"


def _format(figure: str, value: float) -> str:
    return f"{value / 1e9:.1f} GB/s" if figure == "bandwidth" else f"{value / 1e9:.0f} G{'OPS' if figure == 'int8' else 'FLOP/s'}"


def _read(path: Path) -> dict[str, dict]:
    """The file's entries by key; nothing where it is missing, unreadable or of another format."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def _write(path: Path, entries: dict[str, dict]) -> None:
    # Written beside the file and renamed over it: a reader sees the old file or the new one, never half of either.
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as handle:
        json.dump({"format": CACHE_FORMAT, "entries": entries}, handle, indent=2)
    os.replace(handle.name, path)
