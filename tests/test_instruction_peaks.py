"""The compiled kernels' ceilings (csrc/instruction_peaks.cpp), and bench_kernels.py's reading of a kernel against
them. What the peaks are worth is a benchmark's business: here, that they are rates and are counted per operation."""

import math

import pytest
from benchmark_scripts import benchmark_module
from compiled_kernels import needs_compiled

from ridgeline.machine.measure import measure_instruction_peaks
from ridgeline.model.native import compiled


@needs_compiled
@pytest.mark.parametrize("threads", [1, 2])
def test_the_peaks_are_rates_per_operation(threads):
    peaks = measure_instruction_peaks(threads=threads, seconds=0.02)
    assert set(peaks) == {"int8_ops_per_s", "fp32_flops_per_s"}
    assert all(math.isfinite(rate) and rate > 0 for rate in peaks.values())


@needs_compiled
def test_a_peak_over_no_time_is_refused():
    with pytest.raises(RuntimeError, match="seconds must be positive"):
        compiled().instruction_peaks(0.0)


def test_no_peaks_without_the_compiled_kernels(monkeypatch):
    from ridgeline.model import native

    monkeypatch.setattr(native, "compiled", lambda: None)  # as on a CPU without AVX2
    assert measure_instruction_peaks() is None


def test_bench_kernels_reads_a_gemv_against_the_int8_peak():
    with benchmark_module("bench_kernels") as bench:
        assert bench.share_of_peak(600e9, {"int8_ops_per_s": 800e9, "fp32_flops_per_s": 200e9}) == pytest.approx(0.75)
        assert bench.share_of_peak(600e9, None) is None
