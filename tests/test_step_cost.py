"""The engine's own step-cost estimate (engine/step_cost.py) and the --itl-target-ms option."""

import random

import pytest

from ridgeline.engine.options import engine_config, parse_itl_target
from ridgeline.engine.scheduler import ItlTarget
from ridgeline.engine.step_cost import OnlineStepCost, step_features
from ridgeline.errors import RidgelineError

TRUTH = (0.012, 0.0015, 0.0007)  # seconds: per step, per decode row, per prompt token


def true_seconds(decode_rows: int, prompt_tokens: int) -> float:
    return TRUTH[0] + TRUTH[1] * decode_rows + TRUTH[2] * prompt_tokens


def chunks(decode_rows: int, prompt_tokens: int) -> list[tuple[int, int, bool]]:
    return [(100, 1, True)] * decode_rows + ([(0, prompt_tokens, True)] if prompt_tokens else [])


def test_features_count_one_token_chunks_as_decode_rows_and_the_rest_as_prompt_tokens():
    assert step_features([(5, 1, True), (7, 1, True), (0, 30, False), (9, 3, True)]) == (2, 33)


def test_nothing_is_predicted_before_a_step_with_prompt_tokens_and_one_with_decode_rows():
    cost = OnlineStepCost()
    assert cost.predict(chunks(4, 0)) is None
    for _ in range(3):
        cost.observe(chunks(4, 0), true_seconds(4, 0))
    assert cost.predict(chunks(4, 16)) is None  # prompt tokens' share unknown
    cost.observe(chunks(0, 256), true_seconds(0, 256))
    assert cost.predict(chunks(4, 16)) is not None


def test_the_estimate_converges_on_noisy_step_times():
    rng = random.Random(0)
    cost = OnlineStepCost()
    for _ in range(200):
        decode_rows, prompt_tokens = rng.randint(0, 32), rng.choice([0, 0, 16, 64, 200, 2048])
        if decode_rows or prompt_tokens:
            cost.observe(chunks(decode_rows, prompt_tokens), true_seconds(decode_rows, prompt_tokens) * rng.uniform(0.95, 1.05))
    assert cost.coefficients == pytest.approx(TRUTH, rel=0.15)
    for decode_rows, prompt_tokens in [(1, 0), (32, 0), (8, 100), (0, 2048)]:
        assert cost.predict(chunks(decode_rows, prompt_tokens)) == pytest.approx(true_seconds(decode_rows, prompt_tokens), rel=0.06)


def test_a_long_run_of_decode_steps_keeps_what_prefill_costs():
    cost = OnlineStepCost(window=8)
    for prompt_tokens in (64, 512, 2048):
        cost.observe(chunks(4, prompt_tokens), true_seconds(4, prompt_tokens))
    for step in range(500):
        decode_rows = 1 + step % 16
        cost.observe(chunks(decode_rows, 0), true_seconds(decode_rows, 0))
    assert cost.predict(chunks(8, 1000)) == pytest.approx(true_seconds(8, 1000), rel=0.02)


def test_the_estimate_follows_the_machine_when_it_slows_down():
    cost = OnlineStepCost(window=16)
    for scale in (1.0, 2.0):  # another process takes half the cores
        for step in range(40):
            decode_rows, prompt_tokens = 1 + step % 8, (0, 100)[step % 2]
            cost.observe(chunks(decode_rows, prompt_tokens), scale * true_seconds(decode_rows, prompt_tokens))
    assert cost.predict(chunks(4, 50)) == pytest.approx(2 * true_seconds(4, 50), rel=0.02)


@pytest.mark.parametrize("text,expected", [
    ("auto", ItlTarget()), ("AUTO", ItlTarget()), ("150", ItlTarget(seconds=0.15)), ("62.5", ItlTarget(seconds=0.0625)),
    ("0", None), ("off", None),
])
def test_itl_target_option(text, expected):
    assert parse_itl_target(text) == expected


@pytest.mark.parametrize("text", ["fast", "-5", "nan", "inf", ""])
def test_a_bad_itl_target_names_the_option(text):
    with pytest.raises(RidgelineError, match="--itl-target-ms takes a number of milliseconds"):
        parse_itl_target(text)


def test_engine_config_carries_the_target_to_the_scheduler():
    assert engine_config(None).scheduler.itl_target is None  # the offline default: the fixed budget
    assert engine_config(None, itl_target=ItlTarget(seconds=0.1)).scheduler.itl_target == ItlTarget(seconds=0.1)


def test_decode_steps_of_one_batch_size_read_as_the_step_s_fixed_cost_not_as_rows():
    # Steps of 1 and 2 rows cannot tell the fixed cost from the rows': the fit leans to the fixed cost, so a
    # 32-row step is predicted below what it takes (and learnt from when it runs), never far above.
    cost = OnlineStepCost()
    cost.observe(chunks(0, 64), true_seconds(0, 64))
    for step in range(8):
        cost.observe(chunks(1 + step % 2, 0), true_seconds(1 + step % 2, 0) * (1.04 if step % 3 else 0.97))
    assert cost.predict(chunks(32, 0)) <= 1.1 * true_seconds(32, 0)
    cost.observe(chunks(32, 0), true_seconds(32, 0))
    cost.observe(chunks(16, 0), true_seconds(16, 0))
    assert cost.predict(chunks(24, 0)) == pytest.approx(true_seconds(24, 0), rel=0.1)


# A burst's start on the default model (this VM, 2026-12-02): a prompt token 0.68 ms, a decode row 1.8 ms (its
# 262k-row LM head row included), 9 ms a step. The model's FLOPs put a decode row at 2.67 prompt tokens.
BURST_TRUTH = (0.009, 0.0018, 0.00068)
GEMMA_RATIO = 2.67


def burst_seconds(decode_rows: int, prompt_tokens: int) -> float:
    return BURST_TRUTH[0] + BURST_TRUTH[1] * decode_rows + BURST_TRUTH[2] * prompt_tokens


def burst_start(cost: OnlineStepCost) -> None:
    """A server's warm-up (two short requests), then a burst's first steps: 128-token prefill chunks with the
    few streams that have started beside them, times off by a few percent either way."""
    rng = random.Random(1)
    cost.observe(chunks(0, 33) + chunks(0, 33)[-1:], burst_seconds(0, 66))
    for _ in range(7):
        cost.observe(chunks(2, 0), burst_seconds(2, 0) * rng.uniform(0.95, 1.05))
    cost.observe(chunks(0, 225), burst_seconds(0, 225))
    for step in range(24):
        decode_rows = 1 + step // 2
        cost.observe(chunks(decode_rows, 128), burst_seconds(decode_rows, 128) * rng.uniform(0.9, 1.1))


def test_a_burst_s_first_steps_price_a_full_decode_batch_from_the_model_s_flops():
    # Before any step of many decode rows, the decode row's share of the mixed steps is small against their
    # prompt tokens' and noise; the model's arithmetic settles it. A target of 2x a 32-row decode step, priced
    # 5x too low, held every mixed step of the burst to the least prefill (measured: 12 ms for a 62 ms step).
    informed, uninformed = OnlineStepCost(decode_row_ratio=GEMMA_RATIO), OnlineStepCost()
    burst_start(informed)
    burst_start(uninformed)
    full_batch = burst_seconds(32, 0)
    assert informed.predict(chunks(32, 0)) == pytest.approx(full_batch, rel=0.25)
    assert uninformed.predict(chunks(32, 0)) < 0.6 * full_batch  # what the pull toward zero gave
    # The mixed steps it saw are still priced as they ran.
    assert informed.predict(chunks(8, 128)) == pytest.approx(burst_seconds(8, 128), rel=0.1)


def test_decode_steps_of_a_full_batch_overrule_the_model_s_ratio():
    # A machine where a decode row costs far less than the FLOPs say (say, a GPU's idle share): once steps of
    # 8 to 32 rows ran, the fit follows them, not the ratio.
    truth = (0.009, 0.0006, 0.00068)
    cost = OnlineStepCost(decode_row_ratio=GEMMA_RATIO)
    for prompt_tokens in (64, 512, 1024, 2048):  # what a prompt token costs is known as well
        cost.observe(chunks(0, prompt_tokens), truth[0] + truth[2] * prompt_tokens)
    for step in range(32):
        decode_rows = 8 + step % 25
        cost.observe(chunks(decode_rows, 0), truth[0] + truth[1] * decode_rows)
    assert cost.predict(chunks(32, 0)) == pytest.approx(truth[0] + truth[1] * 32, rel=0.1)


def test_a_negative_decode_row_ratio_is_refused():
    with pytest.raises(ValueError, match="decode_row_ratio"):
        OnlineStepCost(decode_row_ratio=-1)


def test_decode_steps_of_one_batch_size_keep_the_model_s_ratio_for_the_slope():
    # A burst's tail: every decode-only step runs the same ~32 rows, which says what 32 rows cost but not what a
    # row does. The ratio keeps pricing the slope until batches at least SLOPE_SPAN rows apart have run.
    cost = OnlineStepCost(decode_row_ratio=GEMMA_RATIO)
    burst_start(cost)
    for step in range(40):
        decode_rows = 30 + step % 3
        cost.observe(chunks(decode_rows, 0), burst_seconds(decode_rows, 0))
    assert cost.predict(chunks(32, 0)) == pytest.approx(burst_seconds(32, 0), rel=0.05)
    assert cost.predict(chunks(12, 0)) == pytest.approx(burst_seconds(12, 0), rel=0.25)


# Logged live on 2026-12-03 (the default model, this VM, `ridgeline serve`): a server's warm-up of two short
# requests, then the first steps of issue 16's burst, as (decode rows, prompt tokens, ms). The 1-row warm-up steps
# ran slower than the 2-row ones, and the mixed steps' times move by 20 % at a near-constant mix. A decode-only
# step of the burst's 31-32 rows took 57 ms in the same hour.
LIVE_BURST_START = [(0, 33, 124.9), (1, 16, 29.5), (1, 16, 24.4), *[(2, 0, ms) for ms in (14.0, 14.7, 14.0, 14.1, 13.9)],
                    (1, 0, 20.0), (1, 0, 16.3), (1, 0, 17.1), (0, 225, 232.8), (1, 128, 73.5), (1, 128, 89.0),
                    (2, 128, 77.8), (2, 128, 87.3), (3, 128, 82.1), (3, 128, 87.2), (4, 128, 81.4), (4, 128, 89.2),
                    (5, 128, 90.8), (5, 128, 89.4), (6, 128, 78.5), (6, 128, 91.9)]
LIVE_FULL_DECODE_STEP = 0.057


def test_a_live_burst_start_prices_a_full_decode_batch_at_every_step():
    # What the ITL target is a multiple of, from the burst's first mixed step on. With the ratio as a pull (a
    # penalty weighing one step) rather than an equality, this read 16 ms for the first ~30 steps of that burst.
    cost = OnlineStepCost(decode_row_ratio=GEMMA_RATIO)
    predicted = []
    for decode_rows, prompt_tokens, ms in LIVE_BURST_START:
        cost.observe(chunks(decode_rows, prompt_tokens), ms / 1e3)
        if decode_rows and prompt_tokens == 128:
            predicted.append(cost.predict(chunks(32, 0)))
            assert cost.predict(chunks(decode_rows, prompt_tokens)) == pytest.approx(ms / 1e3, rel=0.25)
    assert all(0.8 * LIVE_FULL_DECODE_STEP <= p <= 1.25 * LIVE_FULL_DECODE_STEP for p in predicted), predicted
