"""`advise` ranks machines by the documents' two rules and says which phase bounds each."""

import json

import pytest
from typer.testing import CliRunner

from ridgeline.cli import register_commands
from ridgeline.cli.app import app
from ridgeline.errors import RidgelineError
from ridgeline.napkin.advise import EFFICIENCY, RequestShape, advise, advise_one
from ridgeline.napkin.hardware import catalogue, catalogued
from ridgeline.napkin.model_specs import model_spec
from ridgeline.napkin.roofline import Roofline


def test_rule_one_decode_is_half_of_bandwidth_over_bytes_per_token():
    shape = model_spec("llama-2-7b").shape("Q4_0")
    m1_max = catalogued("apple-m1-max")
    advice = advise_one(shape, m1_max, RequestShape(prompt_tokens=1, output_tokens=1))
    bytes_per_token = Roofline(shape, m1_max).decode_bytes_per_token(context=1)
    assert advice.tokens_per_s_per_stream == pytest.approx(EFFICIENCY * m1_max.bandwidth / bytes_per_token)
    assert advice.decode_side == "memory"


def test_rule_two_long_prompts_are_prefill_bound_and_favour_compute_over_bandwidth():
    shape = model_spec("llama-3.1-8b").shape("Q4_K_M")
    coding_agent = RequestShape(prompt_tokens=40_000, output_tokens=200)
    spark, m4_max = catalogued("nvidia-dgx-spark"), catalogued("apple-m4-max")
    on_spark, on_mac = advise_one(shape, spark, coding_agent), advise_one(shape, m4_max, coding_agent)
    assert m4_max.bandwidth > spark.bandwidth and spark.flops() > m4_max.flops()
    assert on_mac.tokens_per_s_per_stream > on_spark.tokens_per_s_per_stream  # the Mac wins decode...
    assert on_spark.ttft_s < on_mac.ttft_s and on_spark.request_s < on_mac.request_s  # ...and loses the request
    assert on_mac.bound_by == "prefill" and on_mac.prefill_side == "compute"

    chat = RequestShape(prompt_tokens=100, output_tokens=1000)
    assert advise_one(shape, m4_max, chat).bound_by == "decode"
    assert advise_one(shape, m4_max, chat).request_s < advise_one(shape, spark, chat).request_s


def test_ranking_puts_fitting_machines_first_fastest_first_and_explains_the_rest():
    shape = model_spec("llama-3.3-70b").shape("Q4_K_M")
    ranking = advise(shape, catalogue().values(), RequestShape(500, 500, concurrency=4))
    fitting = [a for a in ranking if a.fits]
    assert [a.request_s for a in fitting] == sorted(a.request_s for a in fitting)
    assert ranking[: len(fitting)] == fitting
    misfits = {a.hardware.name: a.why_not for a in ranking if not a.fits}
    assert set(misfits) == {"nvidia-rtx-4090", "apple-m4-mini-16gb"}
    assert "weights need 43.1 GB" in misfits["nvidia-rtx-4090"]


def test_concurrency_multiplies_total_throughput_and_kv_can_be_what_does_not_fit():
    shape = model_spec("llama-3.1-8b").shape("Q4_K_M")
    m4_pro = catalogued("apple-m4-pro-48gb")
    one, sixteen = (advise_one(shape, m4_pro, RequestShape(1000, 1000, c)) for c in (1, 16))
    # Batching multiplies throughput until decode crosses the M4 Pro's low ridge (31 FLOP/byte).
    assert one.decode_side == "memory" and sixteen.decode_side == "compute"
    assert sixteen.tokens_per_s_total > 5 * one.tokens_per_s_total
    assert sixteen.tokens_per_s_total == pytest.approx(16 * sixteen.tokens_per_s_per_stream)
    crowded = advise_one(shape, m4_pro, RequestShape(100_000, 1000, concurrency=8))
    assert not crowded.fits and "KV" in crowded.why_not


def test_a_model_that_fits_nowhere_is_a_clear_error():
    with pytest.raises(RidgelineError, match="does not fit any catalogued machine within 100 GB"):
        advise(model_spec("llama-3.3-70b").shape("FP16"), catalogue().values(), RequestShape(10, 10), budget_bytes=100e9)


def test_advise_cli_json_ranks_and_states_its_rules():
    register_commands()
    args = ["advise", "--prompt-tokens", "2000", "--output-tokens", "300", "--model", "qwen2.5-7b", "--weights", "Q8_0", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["model"] == "qwen2.5-7b" and report["weights"] == "Q8_0"
    assert len(report["rules"]) == 2 and "50%" in report["rules"][0]
    assert report["ranking"][0]["hardware"] == "nvidia-h200"
    assert {row["bound_by"] for row in report["ranking"]} <= {"prefill", "decode"}
