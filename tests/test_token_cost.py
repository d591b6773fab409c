"""Dollars per million tokens: the arithmetic (hand-computed figures), the catalogue's prices and their sources,
and `advise` pricing a workload at its SLO."""

import json

import pytest
from typer.testing import CliRunner

from ridgeline.cli import register_commands
from ridgeline.cli.app import app
from ridgeline.napkin.advise import RequestShape, Slo, advise_one, at_slo
from ridgeline.napkin.hardware import THIS_MACHINE, catalogue, catalogued, ownership, price_of
from ridgeline.napkin.model_specs import model_spec
from ridgeline.napkin.token_cost import PhaseWork, split_step, token_cost, usd_per_mtok, work_at_rates


def test_prices_follow_each_phase_by_hand():
    # $3.60/h is $0.001/s. 1,000 prompt tokens in 1 s of prefill cost $0.001: $1 per million. 100 completion tokens
    # in 2 s of decode cost $0.002: $20 per million. All 1,100 tokens cost $0.003: $2.7272... per million.
    cost = token_cost(PhaseWork(prompt_tokens=1000, completion_tokens=100, prefill_s=1.0, decode_s=2.0), 3.60)
    assert cost.prompt_usd_per_mtok == pytest.approx(1.0)
    assert cost.completion_usd_per_mtok == pytest.approx(20.0)
    assert cost.blended_usd_per_mtok == pytest.approx(3000 / 1100)
    assert cost.utilisation == 1.0
    # The blend is the two prices weighted by the mix of tokens.
    assert cost.blended_usd_per_mtok == pytest.approx((1000 * 1.0 + 100 * 20.0) / 1100)


def test_idle_time_is_paid_and_shared_by_the_phases():
    # Busy 3 s of a 6 s span: the machine costs $0.006, half of it idle; every price doubles.
    cost = token_cost(PhaseWork(1000, 100, 1.0, 2.0, span_s=6.0), 3.60)
    assert (cost.prompt_usd_per_mtok, cost.completion_usd_per_mtok) == pytest.approx((2.0, 40.0))
    assert cost.blended_usd_per_mtok == pytest.approx(6000 / 1100)
    assert cost.utilisation == pytest.approx(0.5)


def test_rates_steps_and_edges():
    # 2,000 prompt tokens/s and 50 decode tokens/s at $7.20/h ($0.002/s): $1 and $40 per million.
    work = work_at_rates(4000, 500, prefill_tokens_per_s=2000, decode_tokens_per_s=50)
    assert (work.prefill_s, work.decode_s) == (2.0, 10.0)
    cost = token_cost(work, 7.20)
    assert (cost.prompt_usd_per_mtok, cost.completion_usd_per_mtok) == pytest.approx((1.0, 40.0))
    assert usd_per_mtok(7.20, 2000) == pytest.approx(1.0)
    # A mixed step of one 30-token prompt chunk and 10 decode rows, 0.08 s: 0.06 s prefill, 0.02 s decode.
    assert split_step(0.08, 30, 10) == pytest.approx((0.06, 0.02))
    assert split_step(0.08, 0, 0) == (0.0, 0.0)
    idle = token_cost(PhaseWork(0, 0, 0.0, 0.0, span_s=10.0), 1.0)
    assert idle.blended_usd_per_mtok is None and idle.utilisation == 0.0
    no_prompts = token_cost(PhaseWork(0, 10, 0.0, 1.0), 3.6)
    assert no_prompts.prompt_usd_per_mtok is None and no_prompts.completion_usd_per_mtok == pytest.approx(100.0)
    with pytest.raises(ValueError, match="usd_per_hour"):
        token_cost(work, -1.0)


def test_every_catalogued_machine_has_a_price_with_a_source():
    terms = ownership()
    assert terms.amortisation_years > 0 and terms.electricity_usd_per_kwh > 0 and len(terms.source) > 10
    for name, machine in catalogue().items():
        price = machine.price
        assert price is not None, f"{name} has no price"
        assert price.usd_per_hour > 0 and len(price.source) > 20, name
        assert price.kind in ("cloud", "owned")
        if price.kind == "owned":  # purchase over the amortisation hours plus power at the electricity price
            expected = (price.purchase_usd / (terms.amortisation_years * terms.hours_per_year)
                        + price.power_w / 1000 * terms.electricity_usd_per_kwh)
            assert price.usd_per_hour == pytest.approx(expected)
    assert catalogued("nvidia-h100-sxm").price.kind == catalogued("nvidia-h200").price.kind == "cloud"
    assert price_of(THIS_MACHINE).usd_per_hour > 0 and price_of(THIS_MACHINE).source


def test_advise_prices_the_workload_from_its_napkin_rates():
    shape = model_spec("llama-3.1-8b").shape("Q4_K_M")
    h100 = catalogued("nvidia-h100-sxm")
    chat = RequestShape(prompt_tokens=500, output_tokens=300, concurrency=8)
    a = advise_one(shape, h100, chat)
    per_s = h100.price.usd_per_hour / 3600
    # Prompt tokens are priced at prefill's rate (prompt / TTFT), completions at all 8 streams' decode rate.
    assert a.cost.prompt_usd_per_mtok == pytest.approx(per_s * a.ttft_s / 500 * 1e6)
    assert a.cost.completion_usd_per_mtok == pytest.approx(per_s / a.tokens_per_s_total * 1e6)
    machine_s = a.ttft_s + 300 / a.tokens_per_s_total  # one request's share of the machine
    assert a.cost.blended_usd_per_mtok == pytest.approx(per_s * machine_s / 800 * 1e6)
    assert advise_one(shape, h100, chat, usd_per_hour=6.0).cost.blended_usd_per_mtok == pytest.approx(
        2 * a.cost.blended_usd_per_mtok)


def test_at_slo_takes_the_largest_batch_that_meets_the_itl():
    shape = model_spec("llama-3.1-8b").shape("BF16")
    h100 = catalogued("nvidia-h100-sxm")
    chat = RequestShape(prompt_tokens=500, output_tokens=300)
    slo = Slo(ttft_s=1.0, itl_s=0.05)
    best = at_slo(shape, h100, chat, slo)
    assert best.meets_slo and best.fits and best.concurrency > 1
    over = advise_one(shape, h100, RequestShape(500, 300, best.concurrency + 1), slo=slo)
    assert not (over.meets_slo and over.fits)
    # A bigger batch is cheaper per completion token while the SLO holds.
    assert best.cost.completion_usd_per_mtok < advise_one(shape, h100, chat).cost.completion_usd_per_mtok
    impossible = at_slo(shape, h100, chat, Slo(itl_s=1e-6))
    assert not impossible.meets_slo and impossible.concurrency == 1


def test_advise_command_reports_dollars_per_million_tokens():
    register_commands()
    result = CliRunner().invoke(app, ["advise", "--model", "llama-3.1-8b", "--prompt-tokens", "500",
                                      "--output-tokens", "300", "--slo-itl-ms", "50", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["hardware"]: row for row in json.loads(result.output)["ranking"]}
    h100 = rows["nvidia-h100-sxm"]
    assert h100["cost"]["usd_per_hour"] == catalogued("nvidia-h100-sxm").price.usd_per_hour
    assert h100["price_source"].startswith("Mercatus")
    assert h100["cost"]["prompt_usd_per_mtok"] < h100["cost"]["completion_usd_per_mtok"]
    overridden = CliRunner().invoke(app, ["advise", "--model", "llama-3.1-8b", "--prompt-tokens", "500",
                                          "--output-tokens", "300", "--usd-per-hour", "1", "--json"])
    assert all(row["cost"]["usd_per_hour"] == 1 for row in json.loads(overridden.output)["ranking"])
    table = CliRunner().invoke(app, ["advise", "--model", "llama-3.1-8b", "--prompt-tokens", "500",
                                     "--output-tokens", "300"])
    assert "$/Mtok" in table.output


def test_simulate_prices_the_run_by_the_time_each_phase_took():
    register_commands()
    args = ["simulate", "--model", "llama-3.1-8b", "--hardware", "nvidia-h100-sxm", "--workload", "rate:4",
            "--num-prompts", "20", "--input-len", "256", "--output-len", "32", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    level = report["levels"][0]
    cost = level["cost"]
    assert report["config"]["price"]["usd_per_hour"] == cost["usd_per_hour"] == 3.0
    # Blended: the whole run on one machine at $3/h over every token served.
    run_usd = 3.0 * level["duration_s"] / 3600
    assert cost["blended_usd_per_mtok"] == pytest.approx(run_usd / (level["prompt_tokens"] + level["output_tokens"]) * 1e6)
    # The two prices re-add to the run's cost, weighted by their tokens.
    assert (cost["prompt_usd_per_mtok"] * level["prompt_tokens"] + cost["completion_usd_per_mtok"]
            * level["output_tokens"]) / 1e6 == pytest.approx(run_usd)
    assert 0 < cost["utilisation"] <= 1 and cost["machines"] == 1
    halved = CliRunner().invoke(app, [*args, "--usd-per-hour", "1.5"])
    assert json.loads(halved.stdout)["levels"][0]["cost"]["blended_usd_per_mtok"] == pytest.approx(
        cost["blended_usd_per_mtok"] / 2)
