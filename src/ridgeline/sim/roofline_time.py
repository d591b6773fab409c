"""Roofline step time: max(compute, memory) of the step on a catalogue machine, derated by its efficiency.

The step reads the weights once (napkin ModelShape.weight_bytes_read over its rows), each sequence's KV once,
and writes its new tokens' KV; it computes the matmul FLOPs of every row (the LM head only for rows that
sample) and attention over each row's attended positions. The napkin Roofline prices that cost against the
machine with its bandwidth and FLOP/s scaled by the efficiency factors (sim/efficiency.py).
"""

import dataclasses

from ridgeline.napkin.hardware import THIS_MACHINE, Hardware
from ridgeline.napkin.model_shape import ModelShape
from ridgeline.napkin.roofline import Roofline, StepCost
from ridgeline.sim.efficiency import Efficiency, machine_efficiency
from ridgeline.sim.engine_path import NAPKIN
from ridgeline.sim.step_time import StepTerms


class RooflineStepTime:
    path = NAPKIN  # a catalogue machine runs an engine that does the napkin's work, no padding
    def __init__(self, shape: ModelShape, hardware: Hardware, precision: str | None = None,
                 efficiency: Efficiency | None = None, step_overhead_s: float = 0.0):
        self.efficiency = efficiency or machine_efficiency(hardware)
        precision = precision or hardware.matmul_precision(shape.integer_weights)
        derated = dataclasses.replace(
            hardware, bandwidth=hardware.bandwidth * self.efficiency.memory,
            dense_flops={precision: hardware.flops(precision) * self.efficiency.compute}, default_precision=precision)
        self.roofline = Roofline(shape, derated, precision)
        self.shape = shape
        self.step_overhead_s = step_overhead_s
        # This machine's title carries its measurement's provenance (when, threads, spread); a catalogue name is enough.
        machine = hardware.title if hardware.name == THIS_MACHINE else hardware.name
        self.name = f"roofline on {machine} ({self.efficiency.source})"

    def seconds(self, terms: StepTerms) -> float:
        nbytes = self.shape.weight_bytes_read(terms.tokens) + terms.kv_read_bytes + terms.kv_write_bytes
        return self.roofline.estimate(StepCost(terms.flops, nbytes, terms.tokens)).seconds + self.step_overhead_s
