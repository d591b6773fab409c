"""The engine's per-step record: its costs are the napkin model's, row by row, and it keeps the last steps."""

import pytest
from server_helpers import tiny_engine

from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import ScheduledChunk, SchedulerOutput
from ridgeline.engine.sequence import Sequence
from ridgeline.engine.step_record import StepRecord, StepRecorder
from ridgeline.napkin.hardware import catalogue
from ridgeline.napkin.model_specs import model_spec
from ridgeline.napkin.roofline import Roofline

KV_BYTES = 2


@pytest.fixture(scope="module")
def roofline() -> Roofline:
    # Gemma 3 270M: sliding-window layers make the KV and attention terms depend on the context non-linearly.
    return Roofline(model_spec("gemma-3-270m").shape(None), next(iter(catalogue().values())), kv_dtype_bytes=KV_BYTES)


def chunk(start: int, num_tokens: int, samples: bool = True) -> ScheduledChunk:
    seq = Sequence("r", list(range(start + num_tokens)), SamplingParams(), 0.0)
    return ScheduledChunk(seq, start, num_tokens, samples, ())


def plan(*chunks: ScheduledChunk) -> SchedulerOutput:
    return SchedulerOutput(list(chunks), [])


@pytest.mark.parametrize("batch,context", [(1, 0), (8, 300), (32, 2000)])
def test_a_decode_step_costs_what_the_roofline_says(roofline, batch, context):
    step = StepRecorder(roofline.shape, KV_BYTES).record(plan(*[chunk(context, 1)] * batch), 0.01)
    cost = roofline.decode_cost(batch, context)
    assert step.kind == "decode" and step.decode_rows == batch and step.tokens == batch
    assert step.flops == pytest.approx(cost.flops)
    assert step.nbytes == pytest.approx(cost.nbytes)
    assert step.intensity == pytest.approx(cost.intensity)
    assert step.flops_per_s == pytest.approx(cost.flops / 0.01)


@pytest.mark.parametrize("length", [2, 100, 2048])
def test_a_whole_prompt_in_one_chunk_costs_what_the_roofline_says(roofline, length):
    step = StepRecorder(roofline.shape, KV_BYTES).record(plan(chunk(0, length)), 0.5)
    cost = roofline.prefill_cost(length)
    assert step.kind == "prefill" and step.prefill_tokens == length
    assert step.flops == pytest.approx(cost.flops)
    assert step.nbytes == pytest.approx(cost.nbytes)


def test_chunks_split_the_prompt_flops_and_each_reads_the_weights(roofline):
    recorder = StepRecorder(roofline.shape, KV_BYTES)
    first = recorder.record(plan(chunk(0, 700, samples=False)), 0.1)
    second = recorder.record(plan(chunk(700, 900)), 0.1)
    assert first.flops + second.flops == pytest.approx(roofline.prefill_cost(1600).flops)
    assert second.weight_bytes == roofline.shape.weight_bytes_read(900)
    assert second.kv_bytes == roofline.shape.kv_bytes_for_context(1600, KV_BYTES)  # prefix read + chunk written


def test_a_mixed_step_reads_the_weights_once_for_all_its_rows(roofline):
    recorder = StepRecorder(roofline.shape, KV_BYTES)
    mixed = recorder.record(plan(chunk(50, 1), chunk(90, 1), chunk(0, 64, samples=False)), 0.02)
    decode = roofline.decode_cost(1, 50).flops + roofline.decode_cost(1, 90).flops
    assert mixed.kind == "mixed" and mixed.decode_rows == 2 and mixed.prefill_rows == 1 and mixed.tokens == 66
    # The chunk samples nothing: its rows stop after the last layer, so no LM-head row of the prompt's is counted.
    lm_head_row = 2 * roofline.shape.lm_head.params
    assert mixed.flops == pytest.approx(decode + roofline.prefill_cost(64).flops - lm_head_row)
    assert mixed.weight_bytes == roofline.shape.weight_bytes_read(66)
    as_json = mixed.to_json()
    assert as_json["decode_context"] == {"min": 50, "mean": 70, "max": 90}
    assert as_json["prefill_chunks"] == [{"start": 0, "tokens": 64, "samples": False}]
    assert as_json["decode_contexts"] == [50, 90]  # every row's context: what the simulator's terms need


def test_the_ring_buffer_keeps_the_last_steps_and_hands_out_what_is_new(roofline):
    recorder = StepRecorder(roofline.shape, KV_BYTES, capacity=5)
    for _ in range(8):
        recorder.record(plan(chunk(10, 1)), 0.01)
    assert recorder.num_recorded == 8
    assert [s.index for s in recorder.recent()] == [3, 4, 5, 6, 7]
    assert [s.index for s in recorder.recent(after=5)] == [6, 7]
    assert [s.index for s in recorder.recent(after=0)] == [3, 4, 5, 6, 7]  # older ones are gone
    assert recorder.recent(after=7) == []
    assert [s.index for s in recorder.recent(limit=2)] == [6, 7]


def test_the_engine_records_every_forward_pass():
    engine = tiny_engine()
    prompt = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog " * 3)
    engine.add_request("a", prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    passes = 0
    while engine.has_unfinished():
        engine.step()
        passes += 1
    steps = engine.steps.recent()
    assert len(steps) == passes == 6  # the prompt in one pass, then 5 decodes (the 6th token is sampled, not computed)
    assert [s.kind for s in steps] == ["prefill"] + ["decode"] * 5
    assert steps[0].prefill_tokens == len(prompt)
    assert [s.decode_contexts for s in steps[1:]] == [(len(prompt) + i,) for i in range(5)]
    assert all(s.seconds > 0 and s.flops > 0 for s in steps)
    # the engine thread's own CPU time in each pass: work, never more than the wall time it took (plus the clocks'
    # different ticks), and carried to /v1/steps
    assert all(0 < s.cpu_seconds <= s.seconds + 1e-3 for s in steps)
    assert StepRecord.from_json(steps[-1].to_json()) == steps[-1]


def test_a_decode_row_verifying_guesses_computes_them_but_reads_the_cache_once(roofline):
    seq = Sequence("r", list(range(101)), SamplingParams(), 0.0)
    verify = ScheduledChunk(seq, 100, 4, True, (), draft_token_ids=(7, 8, 9))  # last token + 3 guesses
    step = StepRecorder(roofline.shape, KV_BYTES).record(plan(verify), 0.01)
    shape = roofline.shape
    assert step.kind == "decode" and step.decode_rows == 1 and step.tokens == 4
    assert step.flops == pytest.approx(4 * shape.matmul_flops_per_token()
                                       + sum(shape.attention_flops_per_token(c) for c in range(100, 104)))
    assert step.kv_bytes == shape.kv_bytes_for_context(100, KV_BYTES)


def test_a_step_records_what_the_itl_target_allowed(roofline):
    from ridgeline.engine.scheduler import StepBudget

    recorder = StepRecorder(roofline.shape, KV_BYTES)
    limited = recorder.record(SchedulerOutput([chunk(40, 1), chunk(0, 48, samples=False)], [], StepBudget(48, 0.09, 0.085)), 0.08)
    assert (limited.prefill_limit, limited.itl_target_s, limited.predicted_s) == (48, 0.09, 0.085)
    assert limited.to_json()["prefill_limit"] == 48 and limited.to_json()["itl_target_s"] == 0.09
    free = recorder.record(plan(chunk(0, 300)), 0.3)  # no decodes, or no target: nothing limited the step
    assert free.to_json()["prefill_limit"] is None and free.itl_target_s is None
