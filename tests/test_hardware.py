"""The hardware catalogue is sourced data; this-machine is measured once, cached, and measured honestly."""

import json
import math

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


@pytest.fixture
def fake_measurements(monkeypatch, tmp_path):
    """Point the cache at a temporary directory and count calls to (instant) fake measurements."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def bandwidth(threads=None):
        calls.append(("bandwidth", threads))
        return 30e9

    def flops(dtype, threads=None):
        calls.append((str(dtype), threads))
        return {torch.bfloat16: 400e9, torch.float32: 200e9}[dtype]

    def int8_ops(threads=None):
        calls.append(("int8", threads))
        return 600e9

    monkeypatch.setattr(measure, "measure_read_bandwidth", bandwidth)
    monkeypatch.setattr(measure, "measure_matmul_flops", flops)
    monkeypatch.setattr(measure, "measure_int8_matmul_ops", int8_ops)
    return calls


def test_this_machine_is_measured_once_then_read_from_the_cache(fake_measurements, tmp_path):
    first = this_machine.this_machine()
    assert len(fake_measurements) == 4
    assert (first.bandwidth, first.flops("bf16"), first.flops("fp32"), first.flops("int8")) == (30e9, 400e9, 200e9, 600e9)
    # the faster float precision is what an engine runs a float model in; int8 is for quantised weights only
    assert first.default_precision == "bf16"
    assert (first.matmul_precision(integer_weights=True), first.matmul_precision(integer_weights=False)) == ("int8", "bf16")
    assert first.ridge_point() == pytest.approx(400e9 / 30e9)
    cached = json.loads((tmp_path / "ridgeline" / "this-machine.json").read_text())
    assert cached["hardware"]["bandwidth"] == 30e9

    assert this_machine.this_machine() == first
    assert len(fake_measurements) == 4  # no new measurement
    this_machine.this_machine(remeasure=True)
    assert len(fake_measurements) == 8


def test_without_compiled_kernels_this_machine_has_no_int8_figure(fake_measurements, monkeypatch):
    """Quantised weights then take a float GEMM (dequantised), so their roof is the float default."""
    monkeypatch.setattr(measure, "measure_int8_matmul_ops", lambda threads=None: None)
    machine = this_machine.this_machine()
    assert "int8" not in machine.dense_flops and machine.matmul_precision(integer_weights=True) == "bf16"


def test_a_different_thread_count_is_measured_afresh(fake_measurements):
    this_machine.this_machine(threads=1)
    this_machine.this_machine(threads=2)
    assert {threads for _, threads in fake_measurements} == {1, 2}


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
