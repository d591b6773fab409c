"""`bench throughput`: every generated token is counted, prefill-phase tokens are kept out of decode throughput,
and the roofline prediction beside each batch size is the napkin model's. No timing assertions."""

import json

import pytest
from typer.testing import CliRunner

from ridgeline.bench import bench_throughput
from ridgeline.bench.bench_throughput import ThroughputConfig, run_throughput
from ridgeline.model.model_source import load_model_shape
from ridgeline.cli.bench_throughput import parse_batch_sizes
from ridgeline.engine.options import engine_config
from ridgeline.errors import RidgelineError
from ridgeline.napkin.hardware import THIS_MACHINE, Hardware
from ridgeline.napkin.measured import parse_points
from ridgeline.napkin.roofline import Roofline

FAKE_MACHINE = Hardware(THIS_MACHINE, "fake machine", bandwidth=20e9, memory_bytes=8e9,
                        dense_flops={"fp32": 100e9}, default_precision="fp32")


@pytest.fixture(autouse=True)
def fake_machine(monkeypatch):
    """The roofline's machine without measuring this one (seconds) or touching the user's cache."""
    monkeypatch.setattr(bench_throughput, "this_machine", lambda threads=None: FAKE_MACHINE)


def run(tiny_hf_llama, batch_sizes, input_len=8, output_len=5, **options):
    config = engine_config(tiny_hf_llama, threads=2, kv_cache_memory="4MiB", **options)
    return run_throughput(ThroughputConfig(config, batch_sizes, input_len, output_len))


def test_every_request_generates_output_len_tokens_and_decode_counts_all_but_the_first(tiny_hf_llama):
    report = run(tiny_hf_llama, (1, 3))
    assert [r.batch for r in report.results] == [1, 3]
    for r in report.results:
        assert r.output_tokens == r.batch * 5
        assert r.decode_tokens == r.batch * 4  # the first token of each comes out of the (one-step) prefill
        assert r.steps == 5  # one prefill step for the whole batch, then four decode steps
        assert r.preemptions == 0
        assert r.prefill_s > 0 and r.decode_s > 0
        assert r.decode_tok_s == pytest.approx(r.decode_tokens / r.decode_s)
        assert r.prefill_tok_s == pytest.approx(r.batch * 8 / r.prefill_s)


def test_tokens_before_the_last_first_token_belong_to_the_prefill_phase(tiny_hf_llama):
    # Two run at a time: the third request starts only when the first two have finished all five tokens.
    (result,) = run(tiny_hf_llama, (3,), max_num_seqs=2).results
    assert result.output_tokens == 15
    assert result.decode_tokens == 4  # only the third request's tokens after its first
    assert result.steps == 10


def test_roofline_prediction_is_the_napkin_decode_ceiling_at_the_average_context(tiny_hf_llama):
    report = run(tiny_hf_llama, (2,), input_len=8, output_len=6)
    (result,) = report.results
    roofline = Roofline(load_model_shape(str(tiny_hf_llama)), FAKE_MACHINE)
    assert result.roofline_tok_s == pytest.approx(roofline.decode(2, 8 + 3).tokens_per_s)
    assert result.fraction_of_roofline == pytest.approx(result.decode_tok_s / result.roofline_tok_s)


def invoke_cli(tiny_hf_llama, *options):
    from ridgeline.cli import register_commands, app

    register_commands()
    result = CliRunner().invoke(app, ["bench", "throughput", "--model", str(tiny_hf_llama), "--batch-sizes", "1,2",
                                      "--input-len", "6", "--output-len", "3", "--threads", "2", *options])
    assert result.exit_code == 0, result.output
    return result


def test_json_report_holds_the_figures_and_roofline_points(tiny_hf_llama):
    result = invoke_cli(tiny_hf_llama, "--json")
    summary = json.loads(result.stdout)
    assert summary["threads"] == 2
    assert [(r["batch"], r["output_tokens"], r["decode_tokens"]) for r in summary["results"]] == [(1, 3, 2), (2, 6, 4)]
    assert all(r["decode_tok_s"] > 0 and r["roofline_tok_s"] > 0 for r in summary["results"])
    points = parse_points(summary)  # readable by `ridgeline roofline --measured`
    assert [(p.phase, p.batch, p.context) for p in points] == [("decode", 1, 7), ("decode", 2, 7)]


def test_table_has_a_row_per_batch_size_and_the_plot_is_written(tiny_hf_llama, tmp_path):
    result = invoke_cli(tiny_hf_llama, "--plot", str(tmp_path / "throughput.png"))
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["1", "2"]
    assert (tmp_path / "throughput.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("text", ["", "0,4", "1,two", "-2"])
def test_bad_batch_sizes_are_a_user_error(text):
    with pytest.raises(RidgelineError, match="--batch-sizes"):
        parse_batch_sizes(text)


def test_an_output_length_below_two_is_a_user_error(tiny_hf_llama):
    with pytest.raises(RidgelineError, match="output length"):
        run(tiny_hf_llama, (1,), output_len=1)
