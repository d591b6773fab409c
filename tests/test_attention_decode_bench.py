"""benchmarks/attention_decode.py builds the step it times as the engine would see it: every row's block table
points at pages of its own, inside the cache, scattered or in a row, and a timed step is one kernel call per
layer that runs; a shape the kernel cannot run is refused by name before anything is timed."""

import argparse
import subprocess
import sys

import pytest
import torch
from benchmark_scripts import BENCHMARKS, benchmark_module
from compiled_kernels import needs_compiled


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("attention_decode") as module:
        yield module


@pytest.mark.parametrize("scattered", [True, False])
def test_every_row_reads_pages_of_its_own_inside_the_cache(bench, scattered):
    rows, keys, layers = 5, 40, 2
    caches, tables, queries = bench.decode_step_inputs(rows, keys, layers, heads=4, kv_heads=1, head_dim=64,
                                                       scattered=scattered)
    pages_per_row = -(-keys // bench.BLOCK_SIZE)
    assert tables.shape == (rows, pages_per_row) and tables.dtype == torch.int32
    assert len(set(tables.flatten().tolist())) == rows * pages_per_row  # no page shared between rows
    slots = caches[0][0].shape[0]
    assert tables.min() >= 0 and (tables.max() + 1) * bench.BLOCK_SIZE <= slots
    assert len(caches) == layers and all(k.dtype == v.dtype == torch.bfloat16 for k, v in caches)
    assert queries.shape == (rows, 4, 64)
    in_a_row = tables.flatten().tolist() == list(range(rows * pages_per_row))
    assert in_a_row != scattered


@needs_compiled  # the benchmark times the compiled kernel
def test_a_timed_step_runs(bench):
    seconds = bench.time_decode_step(rows=3, keys=50, layers=2, heads=4, kv_heads=1, head_dim=64, scattered=True,
                                     repeats=2)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)



def step_shape(**changes) -> argparse.Namespace:
    """The benchmark's default step (Gemma 3 270M's heads, 32 rows x 300 keys), with `changes`."""
    shape = {"rows": 32, "keys": 300, "layers": 18, "heads": 4, "kv_heads": 1, "head_dim": 256, "threads": 2,
             "repeats": 60}
    return argparse.Namespace(**{**shape, **changes})


@pytest.mark.parametrize(("changes", "named"), [
    ({"keys": 0}, "--keys must be at least 1, got 0"),
    ({"kv_heads": -1}, "--kv-heads must be at least 1, got -1"),
    ({"head_dim": 48}, "--head-dim must be a multiple of 32"),
    ({"heads": 3, "kv_heads": 2}, "--heads (3) must be a multiple of --kv-heads (2)"),
])
def test_a_shape_the_kernel_cannot_run_is_refused_by_name(bench, changes, named):
    assert named in bench.shape_problem(step_shape(**changes))


def test_the_default_shape_is_accepted(bench):
    assert bench.shape_problem(step_shape()) is None


def test_the_script_exits_with_the_message_before_timing_anything():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "attention_decode.py"), "--keys", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--keys must be at least 1, got 0" in done.stderr
