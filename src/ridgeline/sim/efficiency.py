"""How much of a machine's paper ceilings real steps reach: one factor for bandwidth, one for FLOP/s.

Where the catalogue holds a published measurement for a machine, the factor is that measurement over the
roofline's ceiling for the same model and test (decode tok/s over the batch-1 bandwidth ceiling; prefill tok/s
over the compute ceiling of the prompt). Elsewhere it is the midpoint of the seed's "real decode lands at
roughly 40-60% of the bandwidth ceiling" (perf/roofline.REALISTIC_BAND) for bandwidth, and for FLOP/s the same
midpoint (dense GEMMs reach more, but a serving step also runs attention, norms and launches). Each factor
carries its source, and `simulate` prints it.
"""

from dataclasses import dataclass
from statistics import median

from ridgeline.napkin.hardware import Hardware, observations
from ridgeline.napkin.model_specs import MODEL_SPECS, model_spec
from ridgeline.napkin.roofline import REALISTIC_BAND, Roofline

DEFAULT_FACTOR = sum(REALISTIC_BAND) / 2


@dataclass(frozen=True)
class Efficiency:
    memory: float
    compute: float
    source: str


def machine_efficiency(hardware: Hardware) -> Efficiency:
    memory, compute = [], []
    for seen in observations():
        if seen.machine != hardware.name or seen.model not in MODEL_SPECS:
            continue
        roofline = Roofline(model_spec(seen.model).shape(seen.weights), hardware)
        if seen.phase == "decode":
            memory.append(seen.tokens_per_s / roofline.decode(1, 0).tokens_per_s)
        elif seen.prompt_tokens:
            compute.append(seen.tokens_per_s / roofline.prefill(seen.prompt_tokens).tokens_per_s)
    parts = []
    if memory:
        parts.append(f"bandwidth {median(memory):.0%} from {len(memory)} catalogue decode measurement(s)")
    if compute:
        parts.append(f"FLOP/s {median(compute):.0%} from {len(compute)} catalogue prefill measurement(s)")
    if not memory or not compute:
        parts.append(f"{DEFAULT_FACTOR:.0%} (the seed's 40-60% band) for the rest")
    return Efficiency(median(memory) if memory else DEFAULT_FACTOR, median(compute) if compute else DEFAULT_FACTOR,
                      "; ".join(parts))
