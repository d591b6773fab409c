"""Profiling through the server: a step record rebuilds the simulator's terms of the plan that produced it, the
cycle-time fit recovers known costs, idle gaps are not cycles, and missing steps or endpoints are clear errors."""

import http.server
import threading

import httpx
import numpy as np
import pytest
from server_helpers import serve_tiny_model, tiny_model_path

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.engine.step_record import PrefillChunk, StepRecord
from ridgeline.errors import RidgelineError
from ridgeline.model.model_source import load_model_shape
from ridgeline.napkin.model_specs import model_spec
from ridgeline.sim.calibrated import TERMS, CalibratedStepTime, Profile, features
from ridgeline.sim.engine_path import NAPKIN, EnginePath
from ridgeline.bench.server_profile import CalibrationLoad, Level, cycles, drive, fit_cycles, mode_of, read_steps
from ridgeline.sim.stamp import Stamp
from ridgeline.sim.step_time import TermsOf

TORCH_PATH = EnginePath(decode_tile=8, prompt_tile=64, logit_tile=8, chunk_span_attention=True, logits_every_chunk=True)
STAMP = Stamp("0" * 40, "test cpu", 2, "test-model")


@pytest.mark.parametrize("path", [NAPKIN, TORCH_PATH], ids=["per-row", "tiled"])
def test_a_step_record_rebuilds_the_terms_of_the_plan_that_produced_it(path):
    engine = LLMEngine(EngineConfig(model=str(tiny_model_path()), kv_cache=KVCacheConfig(4, "fp32", 4 << 20),
                                    scheduler=SchedulerConfig(max_num_batched_tokens=64)))
    terms_of = TermsOf(load_model_shape(engine.config.model), engine.config.kv_cache.bytes_per_value, path)
    plans = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        plans.append(schedule())
        return plans[-1]

    engine.scheduler.schedule = recording_schedule
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    engine.add_request("a", list(range(3, 40)), params)
    engine.step()
    # A prompt longer than the step's token budget (chunked, its first chunk does not sample), one sharing a's
    # cached prefix (starts past 0) and decodes, all in the same steps.
    engine.add_request("b", [3 + i % 390 for i in range(200)], params)
    engine.add_request("c", list(range(3, 30)) + [7] * 20, params)
    while engine.has_unfinished():
        engine.step()
    plans = [plan for plan in plans if plan.chunks]
    records = engine.steps.recent()
    assert len(records) == len(plans) > 3
    assert any(not c.samples for plan in plans for c in plan.chunks)  # a chunk that does not sample was seen
    assert any(c.start > 0 and c.num_tokens > 1 for plan in plans for c in plan.chunks)
    for plan, record in zip(plans, records):
        served = StepRecord.from_json(record.to_json())  # as GET /v1/steps hands it over
        assert served == record
        assert terms_of.of_record(served) == terms_of(plan)


def synthetic_records(truth: np.ndarray, terms_of: TermsOf, rng: np.random.Generator) -> list[StepRecord]:
    """Back-to-back steps whose cycle (forward start to the next forward start) is exactly truth . features; the
    forward pass is a random part of it, so only the cycle, not the recorded seconds, carries the costs."""
    records, start = [], 1000.0
    for index in range(80):
        contexts = tuple(int(c) for c in rng.integers(1, 900, size=int(rng.integers(0, 20))))
        chunks = tuple(PrefillChunk(int(rng.integers(0, 300)), int(rng.integers(2, 700)), bool(rng.random() < 0.7))
                       for _ in range(int(rng.integers(0 if contexts else 1, 3))))
        record = StepRecord(index, 0.0, 0.0, len(contexts) + sum(c.tokens for c in chunks), contexts, chunks,
                            0.0, 0.0, 0.0, after_idle=index == 0)
        cycle = float(truth @ features(terms_of.of_record(record)))
        forward = cycle * rng.uniform(0.3, 0.9)
        records.append(StepRecord(index, start + forward, forward, record.tokens, contexts, chunks, 0.0, 0.0, 0.0,
                                  record.after_idle))
        start += cycle
    return records


def test_the_cycle_time_fit_recovers_known_costs():
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, TORCH_PATH)
    truth = np.array([3e-3, 2e-4, 4e-3, 9e-3, 1e-3, 2e-12, 0.0])
    records = synthetic_records(truth, terms_of, np.random.default_rng(0))
    profile = fit_cycles([records], terms_of, STAMP, {"engine_path": {}})
    assert profile.source == "server" and profile.samples == len(records) - 1  # the last step has no next one
    assert np.array(profile.coefficients) == pytest.approx(truth, rel=1e-4, abs=1e-14)
    assert profile.median_abs_error < 1e-9
    # The model prices a step as its cycle: the simulator's CalibratedStepTime gives back the cycles.
    model = CalibratedStepTime(profile)
    step, seconds = cycles(records)[5]
    assert model.seconds(terms_of.of_record(step)) == pytest.approx(seconds)


def test_idle_gaps_missing_records_and_speculative_steps_are_not_cycles():
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, NAPKIN)
    records = synthetic_records(np.array([3e-3, 2e-4, 0, 0, 0, 0, 0]), terms_of, np.random.default_rng(1))
    # The engine waited 5 s before step 30 (it follows idle), step 50 is missing, step 60 verified guesses.
    shifted = [r if r.index < 30 else StepRecord(r.index, r.timestamp + 5, r.seconds, r.tokens, r.decode_contexts,
                                                 r.prefill_chunks, 0, 0, 0, r.after_idle or r.index == 30)
               for r in records if r.index != 50]
    shifted[59] = StepRecord(60, shifted[59].timestamp, shifted[59].seconds, shifted[59].tokens + 3,
                             shifted[59].decode_contexts, shifted[59].prefill_chunks, 0, 0, 0)
    kept = {step.index for step, _ in cycles(shifted)}
    assert 29 not in kept  # its cycle would span the idle wait
    assert 49 not in kept and 50 not in kept and 60 not in kept
    assert 28 in kept and 30 in kept and 51 in kept
    assert max(seconds for _, seconds in cycles(shifted)) < 1  # no wait was counted as a step
    profile = fit_cycles([shifted], terms_of, STAMP, {})
    assert profile.coefficients[:2] == pytest.approx((3e-3, 2e-4), rel=1e-6)


def test_the_server_marks_steps_after_idle_and_serves_what_the_fit_needs():
    body = {"prompt": "hello there", "max_tokens": 4, "ignore_eos": True}
    with serve_tiny_model() as server:
        for _ in range(2):  # one request, the engine idles, another
            assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
        records, recorded = read_steps(server.url)
    assert recorded == len(records) >= 8
    first_steps = [record.index for record in records if record.after_idle]
    assert first_steps[0] == 0 and len(first_steps) == 2  # each request's prefill followed a wait
    assert {step.index for step, _ in cycles(records)} == {r.index for r in records} - {first_steps[1] - 1,
                                                                                          records[-1].index}


def test_no_steps_is_a_clear_error():
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, NAPKIN)
    with pytest.raises(RidgelineError, match="recorded no steps"):
        fit_cycles([], terms_of, STAMP, {})
    lone = [StepRecord(i, 10.0 * i, 0.01, 1, (5,), (), 0, 0, 0, after_idle=True) for i in range(5)]
    with pytest.raises(RidgelineError, match="back to back"):
        fit_cycles([lone], terms_of, STAMP, {})


class NotRidgeline(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_error(404)

    def log_message(self, *args):
        pass


def test_a_server_without_v1_steps_is_a_clear_error():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotRidgeline)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RidgelineError, match="has no /v1/steps"):
            read_steps(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        # shutdown() only stops the serving loop: the socket would still accept connections that nobody answers,
        # and the read below would wait out its timeout (60 s) instead of being refused at once.
        server.server_close()
    with pytest.raises(RidgelineError, match="cannot read"):
        read_steps(f"http://127.0.0.1:{server.server_address[1]}")  # nothing listens there any more


def test_the_calibration_load_is_not_the_validation_traces(tmp_path):
    load = CalibrationLoad()
    validation_prompts, validation_outputs = {96, 320, 896, 1408}, {12, 24, 48}  # benchmarks/sim_vs_real.py
    lengths = {n for level in load.levels for n in level.prompt_tokens or load.prompt_tokens}
    outputs = {n for level in load.levels for n in level.output_tokens or load.output_tokens}
    assert not lengths & validation_prompts and not outputs & validation_outputs
    seeds = {load.seed + 100 * run + level for run in range(len(load.modes)) for level in range(len(load.levels))}
    assert not seeds & set(range(200, 208))  # the validation's trace seeds
    rows = [line for level in range(len(load.levels))
            for line in load.trace(tmp_path / f"{level}.jsonl", level, 1000).read_text().splitlines()]
    assert len(rows) == sum(level.requests for level in load.levels)


def test_the_calibration_load_covers_both_modes_and_contexts_apart_from_rows():
    """Whole prompts beside decodes (the fixed budget) as well as small chunks (an ITL target); and decode batches
    of one size at short and at long contexts, so the KV read is not carried by the row count."""
    load = CalibrationLoad()
    assert set(load.modes) == {"auto", "0"}
    batches = [level for level in load.levels if level.prompt_tokens and level.concurrency]
    short, long = min(batches, key=lambda l: max(l.prompt_tokens)), max(batches, key=lambda l: min(l.prompt_tokens))
    assert short.concurrency == long.concurrency and 10 * max(short.prompt_tokens) <= min(long.prompt_tokens)


def test_a_profile_keeps_its_source():
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, NAPKIN)
    records = synthetic_records(np.array([3e-3, 2e-4, 0, 0, 0, 0, 0]), terms_of, np.random.default_rng(2))
    profile = fit_cycles([records], terms_of, STAMP, {})
    assert len(profile.coefficients) == len(TERMS)
    assert "server step cycles" in CalibratedStepTime(profile).name


def test_a_profile_round_trips_with_its_source(tmp_path):
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, NAPKIN)
    records = synthetic_records(np.array([3e-3, 2e-4, 0, 0, 0, 0, 0]), terms_of, np.random.default_rng(3))
    profile = fit_cycles([records], terms_of, STAMP, {})
    assert Profile.load(profile.save(tmp_path / "p.json")) == profile


def test_a_calibration_load_through_a_server_fits_a_profile(tmp_path):
    load = CalibrationLoad(prompt_tokens=(5, 30, 90), output_tokens=(6, 12), shared_prefix=8,
                           levels=(Level("warm-up", 2, None, 2), Level("concurrency 1", 1, None, 3),
                                   Level("rate 50", None, 50.0, 8), Level("concurrency 6", 6, None, 8)))
    with serve_tiny_model() as server:
        records = drive(server.url, load, 300, tmp_path)
        terms_of = TermsOf(load_model_shape(str(tiny_model_path())), 4, NAPKIN)
        profile = fit_cycles([records], terms_of, STAMP, {})
    assert min(record.index for record in records) > 0  # the warm-up's steps are left out
    assert profile.samples >= 2 * len(TERMS) and all(c >= 0 for c in profile.coefficients)
    assert max(record.decode_rows for record in records) > 1  # the batch level batched


def test_the_fit_is_not_biased_low_by_right_skewed_noise():
    """A shared machine's step times have a long right tail. Weighting each step by its own measured 1/y would
    favour the fast draws and fit below the mean; the fit predicts the mean of steps that look alike."""
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, NAPKIN)
    rng = np.random.default_rng(4)
    truth = np.array([3e-3, 2e-4, 4e-4, 9e-4, 1e-4, 2e-12, 0.0])
    clean = synthetic_records(truth, terms_of, rng)
    rows = [(terms_of.of_record(step), seconds * rng.lognormal(0, 0.35)) for step, seconds in cycles(clean)]
    profile = Profile.fit(STAMP, rows, {}, source="server")
    model = CalibratedStepTime(profile)
    predicted = sum(model.seconds(terms) for terms, _ in rows)
    measured = sum(seconds for _, seconds in rows)
    assert predicted / measured == pytest.approx(1.0, abs=0.04)
