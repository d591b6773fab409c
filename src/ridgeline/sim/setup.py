"""From command-line choices to a Deployment: the model's shape, its KV pool on the machine, the step-time model."""

import os
from dataclasses import dataclass
from pathlib import Path

from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.errors import RidgelineError
from ridgeline.napkin.hardware import THIS_MACHINE, catalogued
from ridgeline.napkin.model_shape import ModelShape
from ridgeline.model.model_source import load_model_shape
from ridgeline.sim.calibrated import CalibratedStepTime, Profile
from ridgeline.sim.engine_path import EnginePath
from ridgeline.sim.step_time import TermsOf
from ridgeline.sim.kv_pool import kv_pool
from ridgeline.sim.link import Link
from ridgeline.sim.roofline_time import RooflineStepTime
from ridgeline.sim.simulator import Deployment
from ridgeline.sim.stamp import current_stamp

# Share of a catalogue machine's memory the engine may use (vLLM's gpu_memory_utilization default): what is left
# of it after the weights is the KV pool unless --kv-cache-memory says otherwise.
MEMORY_UTILISATION = 0.9


@dataclass(frozen=True)
class SimOptions:
    model: str | None = None  # file, HF directory or built-in spec (None: the bundled model)
    weights: str | None = None
    hardware: str | None = None  # catalogue name; None with calibrated
    precision: str | None = None
    kv_bytes: float = 2  # bytes per KV element (1: an 8-bit KV cache)
    kv_cache_memory: float | None = None  # bytes per replica; None: what the machine has left after the weights
    scheduler: SchedulerConfig = SchedulerConfig()
    block_size: int = 16  # tokens per KV page
    replicas: int = 1
    disaggregate: tuple[int, int] | None = None
    link: Link = Link()
    calibrated: bool = False
    profile: str | None = None
    threads: int | None = None


def profile_path(model_name: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ridgeline" / "profiles" / f"{model_name}.json"


def parse_split(text: str | None) -> tuple[int, int] | None:
    """'P:D' -> (P, D)."""
    if text is None:
        return None
    try:
        prefill, decode = (int(part) for part in text.split(":"))
    except ValueError:
        raise RidgelineError(f"--disaggregate takes P:D, two replica counts such as 1:3, got {text!r}") from None
    if prefill < 1 or decode < 1:
        raise RidgelineError(f"--disaggregate needs at least one replica on each side, got {text!r}")
    return prefill, decode


def calibrated_step_time(shape: ModelShape, options: SimOptions) -> CalibratedStepTime:
    import torch

    path = options.profile or profile_path(shape.name)
    profile = Profile.load(path)
    profile.stamp.check(current_stamp(shape.name, options.threads or torch.get_num_threads()), path)
    terms_of = TermsOf(shape, options.kv_bytes, EnginePath.from_settings(profile.settings))  # as its steps were counted
    return CalibratedStepTime(profile, str(path), terms_of)


def deployment(options: SimOptions) -> Deployment:
    if options.calibrated and options.hardware not in (None, THIS_MACHINE):
        raise RidgelineError("--calibrated simulates this machine (its measured profile); drop --hardware")
    if not options.calibrated and options.hardware is None:
        raise RidgelineError("give --hardware (a catalogue machine) or --calibrated (this machine's measured profile)")
    shape = load_model_shape(options.model, options.weights)
    if options.calibrated:
        step_time = calibrated_step_time(shape, options)
        memory = options.kv_cache_memory or 2 << 30  # serve's default budget
    else:
        if options.hardware == THIS_MACHINE:  # its measured ceilings: a roofline of this machine, not a profile
            from ridgeline.machine.this_machine import this_machine

            hardware = this_machine(threads=options.threads)  # as `ridgeline measure` cached it
        else:
            hardware = catalogued(options.hardware)
        step_time = RooflineStepTime(shape, hardware, options.precision)
        left = hardware.memory_bytes * MEMORY_UTILISATION - shape.total_weight_bytes
        if options.kv_cache_memory is None and left <= 0:
            raise RidgelineError(f"{shape.name} ({shape.total_weight_bytes / 1e9:.1f} GB of {shape.weights} weights) "
                                 f"does not fit {hardware.name} ({hardware.memory_bytes / 1e9:.0f} GB)")
        memory = options.kv_cache_memory or left
    pool = kv_pool(shape, memory, options.block_size, options.kv_bytes)
    return Deployment(shape, pool, options.scheduler, step_time, options.kv_bytes, options.replicas,
                      options.disaggregate, options.link)
