"""The hardware catalogue is sourced data; this-machine is measured robustly, cached per thread count with its
provenance, and never replaced by a worse reading unasked."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from ridgeline.bench import bench_latency
from ridgeline.machine import measure, this_machine
from ridgeline.cli import register_commands
from ridgeline.cli.app import app
from ridgeline.napkin.hardware import catalogue, catalogue_version, observations
from ridgeline.napkin.measured import parse_points

REQUIRED_MACHINES = {
    "apple-m1-max", "apple-m1-ultra", "apple-m2-max", "apple-m2-ultra", "apple-m4-max", "apple-m4-mini-16gb",
    "apple-m4-pro-48gb", "nvidia-h100-sxm", "nvidia-h200", "nvidia-dgx-spark", "nvidia-rtx-4090", "amd-strix-halo",
}


def test_catalogue_is_versioned_and_lists_every_machine_the_documents_discuss():
    assert isinstance(catalogue_version(), int)
    assert REQUIRED_MACHINES <= set(catalogue())


@pytest.mark.parametrize("name", sorted(REQUIRED_MACHINES))
def test_every_figure_has_a_public_source(name):
    machine = catalogue()[name]
    assert machine.bandwidth > 1e10 and machine.memory_bytes > 1e9
    assert machine.default_precision in machine.dense_flops
    assert all(flops > 1e12 for flops in machine.dense_flops.values())
    for figure in ("bandwidth", "memory", "flops"):
        assert len(machine.sources.get(figure, "")) > 10, f"{name}: no source for {figure}"


def test_document_figures_are_the_catalogued_ones():
    machines = catalogue()
    assert machines["apple-m1-max"].bandwidth == machines["apple-m2-max"].bandwidth == 400e9
    assert machines["apple-m1-ultra"].bandwidth == machines["apple-m2-ultra"].bandwidth == 800e9
    assert machines["nvidia-h100-sxm"].bandwidth == 3.35e12
    spark = machines["nvidia-dgx-spark"]
    assert (spark.bandwidth, spark.memory_bytes, spark.flops("fp4")) == (273e9, 128e9, 1e15 / 2)  # 1 PFLOP sparse
    assert machines["apple-m4-mini-16gb"].memory_bytes == 16e9 and machines["apple-m4-pro-48gb"].memory_bytes == 48e9
    assert all(o.machine in machines and o.source for o in observations())


class Calls(list):
    readings: dict


@pytest.fixture
def fake_measurements(monkeypatch, tmp_path):
    """Point the cache at a temporary directory and count calls to (instant) fake measurements; `readings` sets what
    they read (a list: one value per round, the last repeated)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = Calls()
    readings = {"bandwidth": [30e9], "bf16": [400e9], "fp32": [200e9], "int8": [600e9]}

    def read(figure, threads):
        calls.append((figure, threads))
        values = readings[figure]
        done = sum(1 for name, _ in calls if name == figure) - 1
        return values[min(done, len(values) - 1)]

    monkeypatch.setattr(measure, "measure_read_bandwidth", lambda threads=None, **_: read("bandwidth", threads))
    monkeypatch.setattr(measure, "measure_matmul_flops",
                        lambda dtype, threads=None, **_: read({torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype], threads))
    monkeypatch.setattr(measure, "measure_int8_matmul_ops", lambda threads=None, **_: read("int8", threads))
    calls.readings = readings
    return calls


def test_this_machine_is_measured_once_then_read_from_the_cache(fake_measurements, tmp_path):
    first = this_machine.this_machine(threads=2)
    assert len(fake_measurements) == 4 * this_machine.ROUNDS
    assert (first.bandwidth, first.flops("bf16"), first.flops("fp32"), first.flops("int8")) == (30e9, 400e9, 200e9, 600e9)
    # the faster float precision is what an engine runs a float model in; int8 is for quantised weights only
    assert first.default_precision == "bf16"
    assert (first.matmul_precision(integer_weights=True), first.matmul_precision(integer_weights=False)) == ("int8", "bf16")
    assert first.ridge_point() == pytest.approx(400e9 / 30e9)
    assert "2 threads" in first.title and "best of 3 rounds" in first.title and "NOISY" not in first.title

    assert this_machine.this_machine(threads=2) == first
    assert len(fake_measurements) == 4 * this_machine.ROUNDS  # no new measurement
    assert this_machine.cached(threads=2).hardware == first


def test_figures_are_each_the_best_round_with_the_spread_recorded(fake_measurements):
    # A burst of load elsewhere lowers one round; the ceiling is the best, and the spread says how steady it was.
    fake_measurements.readings["bandwidth"] = [20e9, 40e9, 38e9]
    entry = this_machine.measure_and_cache(threads=1).kept
    assert entry.hardware.bandwidth == 40e9
    assert entry.samples["bandwidth"] == [20e9, 40e9, 38e9]
    assert entry.provenance.spread["bandwidth"] == pytest.approx(0.5) and entry.provenance.spread["bf16"] == 0
    assert entry.provenance.noisy and "NOISY" in entry.hardware.title and "spread up to 50% (bandwidth)" in entry.hardware.title


def test_without_compiled_kernels_this_machine_has_no_int8_figure(fake_measurements, monkeypatch):
    """Quantised weights then take a float GEMM (dequantised), so their roof is the float default."""
    monkeypatch.setattr(measure, "measure_int8_matmul_ops", lambda threads=None, **_: None)
    machine = this_machine.this_machine()
    assert "int8" not in machine.dense_flops and machine.matmul_precision(integer_weights=True) == "bf16"


def test_thread_counts_are_cached_side_by_side(fake_measurements):
    one = this_machine.this_machine(threads=1)
    fake_measurements.readings["bandwidth"] = [50e9]
    two = this_machine.this_machine(threads=2)
    assert {threads for _, threads in fake_measurements} == {1, 2}
    assert (this_machine.cached(threads=1).hardware, this_machine.cached(threads=2).hardware) == (one, two)
    assert [entry.provenance.threads for entry in this_machine.cached_entries()] == [1, 2]


def test_a_worse_measurement_keeps_the_cached_entry_and_says_so(fake_measurements):
    register_commands()
    assert CliRunner().invoke(app, ["measure", "--threads", "2"]).exit_code == 0
    # The machine is busy now: bandwidth reads half of what it did.
    fake_measurements.readings["bandwidth"] = [15e9]
    result = CliRunner().invoke(app, ["measure", "--threads", "2"])
    assert result.exit_code == 0, result.output
    assert "kept the cached entry" in result.output and "bandwidth 15.0 GB/s (cached 30.0 GB/s)" in result.output
    assert "--force" in result.output
    assert this_machine.cached(threads=2).hardware.bandwidth == 30e9
    # A better one replaces it; --force replaces it with a worse one.
    fake_measurements.readings["bandwidth"] = [32e9]
    assert this_machine.measure_and_cache(threads=2).replaced and this_machine.cached(threads=2).hardware.bandwidth == 32e9
    fake_measurements.readings["bandwidth"] = [15e9]
    result = CliRunner().invoke(app, ["measure", "--threads", "2", "--force"])
    assert result.exit_code == 0 and "cached: bandwidth 15.0 GB/s" in result.output
    assert this_machine.cached(threads=2).hardware.bandwidth == 15e9


def test_roofline_remeasure_does_not_replace_a_better_entry(fake_measurements):
    this_machine.this_machine(threads=3)
    fake_measurements.readings["int8"] = [60e9]  # the int8 peak a start beside the engine's start-up read
    assert this_machine.this_machine(remeasure=True, threads=3).flops("int8") == 600e9


def test_an_entry_of_another_torch_build_is_flagged_stale(fake_measurements, monkeypatch):
    entry = this_machine.measure_and_cache(threads=1).kept
    assert not entry.provenance.stale()
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert entry.provenance.stale() and "STALE" in this_machine.cached(threads=1).hardware.title


CONCURRENT_MEASURER = """
import sys, time
import torch
from ridgeline.machine import measure, this_machine

threads, bandwidth = int(sys.argv[1]), float(sys.argv[2])
def slow(value):
    time.sleep(0.002)  # long enough that the two processes' reads and writes interleave
    return value
measure.measure_read_bandwidth = lambda threads=None, **_: slow(bandwidth)
measure.measure_matmul_flops = lambda dtype, threads=None, **_: slow(400e9)
measure.measure_int8_matmul_ops = lambda threads=None, **_: None
write = this_machine._write
def slow_write(path, entries):
    time.sleep(0.005)  # widens the window between reading the file and writing it back
    write(path, entries)
this_machine._write = slow_write
seen = set()
for _ in range(40):
    assert this_machine.measure_and_cache(threads).replaced
    # An entry once in the file stays there: a write that had read the file before the other process wrote would
    # drop the other's entry, and this process would see it gone right after its own write.
    keys = set(this_machine._read(this_machine.cache_path()))
    assert seen <= keys, f"entries evicted: {seen - keys}"
    seen = keys
"""


def test_two_processes_with_different_thread_counts_never_evict_each_other(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    processes = [subprocess.Popen([sys.executable, "-c", CONCURRENT_MEASURER, str(threads), str(bandwidth)], env=env,
                                  stderr=subprocess.PIPE, text=True)
                 for threads, bandwidth in ((1, 10e9), (2, 20e9))]
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    cache = json.loads((tmp_path / "ridgeline" / "this-machine-by-threads.json").read_text())
    assert sorted(entry["provenance"]["threads"] for entry in cache["entries"].values()) == [1, 2]
    assert sorted(entry["hardware"]["bandwidth"] for entry in cache["entries"].values()) == [10e9, 20e9]


def test_matmul_flops_counts_2n_cubed_per_product_and_restores_threads(monkeypatch):
    threads_before = torch.get_num_threads()
    seen_threads, windows = [], []

    def one_second(kernel, device, seconds):
        kernel()
        seen_threads.append(torch.get_num_threads())
        windows.append(seconds)
        return 1.0

    monkeypatch.setattr(measure, "best_seconds", one_second)
    assert measure.measure_matmul_flops(torch.float32, threads=1, size=64) == 2 * 64**3
    assert measure.measure_read_bandwidth(threads=1, nbytes=2**20) == 2**20
    assert seen_threads == [1, 1]
    assert torch.get_num_threads() == threads_before
    # The bandwidth is a ceiling: its best comes and goes on a shared VM, so it is looked for over a longer window.
    assert windows[1] == measure.READ_BANDWIDTH_SECONDS >= 6 * windows[0]


def test_real_measurements_on_small_sizes_are_finite_and_plausible():
    bandwidth = measure.measure_read_bandwidth(nbytes=16 * 2**20, seconds=0.05)
    flops = measure.measure_matmul_flops(torch.float32, size=128, seconds=0.05)
    assert math.isfinite(bandwidth) and 1e8 < bandwidth < 1e13
    assert math.isfinite(flops) and 1e8 < flops < 1e16
    int8_ops = measure.measure_int8_matmul_ops(rows=16, shape=(256, 256), seconds=0.05)
    assert int8_ops is None or (math.isfinite(int8_ops) and 1e8 < int8_ops < 1e16)


def test_roofline_cli_reports_json_and_draws_the_chart(tmp_path):
    register_commands()
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps([{"label": "tg", "phase": "decode", "batch": 1, "context": 4096, "tokens_per_s": 40.0}]))
    chart = tmp_path / "roofline.png"
    args = ["roofline", "--model", "llama-3.1-8b", "--weights", "Q4_K_M", "--hardware", "apple-m4-max",
            "--batch", "8", "--context", "4096", "--json", "--plot", str(chart), "--measured", str(measured)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["hardware"] == "apple-m4-max" and report["decode"]["batch"] == 8
    assert report["kv"]["bytes_per_token"] == 131_072 and report["kv"]["gqa_reduction"] == 4
    assert report["measured"][0]["fraction_of_ceiling"] == pytest.approx(40.0 / report["decode"]["ceiling_tokens_per_s"])
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_roofline_cli_rejects_bad_measured_files(tmp_path):
    register_commands()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"phase": "warmup", "tokens_per_s": 1}]))
    result = CliRunner().invoke(app, ["roofline", "--model", "llama-2-7b", "--hardware", "apple-m1-max", "--measured", str(bad)])
    assert result.exit_code != 0
    assert "phase 'prefill' or 'decode'" in str(result.exception)


def test_bench_latency_puts_quantised_weights_against_the_int8_rate():
    """pp % of peak: a quantised model's prompt runs on the int8 kernels, so it is a share of their rate (against
    bf16's, the default model's prompt read 76 % of a "peak" it does not run on); dequantised weights, a float file,
    or a machine without the kernels keep the float GEMM's."""
    both, floats_only = {"bf16": 400e9, "int8": 650e9}, {"bf16": 400e9}
    assert bench_latency.matmul_precision("quantized", True, both) == "int8"
    assert bench_latency.matmul_precision("bf16", True, both) == "bf16"
    assert bench_latency.matmul_precision("quantized", False, both) == "bf16"
    assert bench_latency.matmul_precision("quantized", True, floats_only) == "bf16"


def test_bench_latency_results_are_read_as_prefill_and_decode_points():
    latency = [{"weights": "quantized", "prompt_tokens": 512, "gen_tokens": 128,
                "pp_tok_s": {"mean": 300.0, "sd": 1.0, "runs": [300.0]}, "tg_tok_s": {"mean": 50.0, "sd": 0.5, "runs": [50.0]}}]
    prefill, decode = parse_points(latency)
    assert (prefill.phase, prefill.prompt_tokens, prefill.tokens_per_s) == ("prefill", 512, 300.0)
    assert (decode.phase, decode.batch, decode.context, decode.tokens_per_s) == ("decode", 1, 64, 50.0)
    assert prefill.label == "ridgeline quantized pp512" and decode.label == "ridgeline quantized tg128"
