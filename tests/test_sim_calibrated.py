"""The calibrated step model: the fit recovers known costs, a profile measured on the real engine drives the
simulator, and a profile stamped for other code, another CPU or another thread count is refused."""

import dataclasses

import numpy as np
import pytest
import torch
from tiny_models import build_hf_model, save_tokenizer

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.errors import RidgelineError
from ridgeline.napkin.model_specs import model_spec
from ridgeline.sim.calibrated import TERMS, CalibratedStepTime, Profile, nonnegative_least_squares
from ridgeline.sim.engine_path import NAPKIN, EnginePath, of_this_engine
from ridgeline.sim.profile import Grid, measure
from ridgeline.sim.setup import SimOptions, deployment
from ridgeline.sim.simulator import simulate
from ridgeline.sim.stamp import Stamp, current_stamp
from ridgeline.sim.step_time import TermsOf
from ridgeline.sim.workload import synthetic


TORCH_PATH = EnginePath(decode_tile=8, prompt_tile=64, logit_tile=8, chunk_span_attention=True, logits_every_chunk=True)


def test_nonnegative_least_squares_recovers_costs_and_never_goes_negative():
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(60), rng.uniform(1, 500, 60), rng.uniform(0, 1e9, 60), rng.uniform(0, 3, 60)])
    truth = np.array([2e-3, 1e-5, 3e-11, 0.0])
    assert nonnegative_least_squares(x, x @ truth) == pytest.approx(truth, rel=1e-6, abs=1e-12)
    # A target only a negative coefficient would fit exactly: the fit clamps it at zero instead.
    y = x @ np.array([2e-3, 1e-5, 3e-11, -1e-3])
    assert (nonnegative_least_squares(x, y) >= 0).all()


@pytest.mark.parametrize("path", [NAPKIN, TORCH_PATH], ids=["per-row", "tiled"])
def test_fit_on_roofline_terms_predicts_a_step_cost_it_was_built_from(path):
    terms_of = TermsOf(model_spec("llama-3.1-8b").shape("BF16"), 2, path)
    coefficients = (1e-3, 2e-5, 3e-3, 9e-3, 4e-3, 1e-13, 2e-12)
    settings = {"engine_path": dataclasses.asdict(path)}
    truth = CalibratedStepTime(Profile(Stamp("c", "cpu", 1, "m"), coefficients, 0, 0.0, settings))
    shapes = [[(0, n, True)] for n in (16, 100, 700, 2000)] + \
             [[(c, 1, True)] * b for b in (1, 8, 64) for c in (10, 900, 4000)] + \
             [[(c, 1, True)] * b + [(s, n, s + n > 300)] for b in (2, 30) for c in (50, 2000) for s, n in ((0, 64), (256, 512))]
    rows = [(terms_of.of_chunks(chunks), truth.seconds(terms_of.of_chunks(chunks))) for chunks in shapes]
    fitted = CalibratedStepTime(Profile.fit(Stamp("c", "cpu", 1, "m"), rows, settings))
    assert fitted.path == path
    assert fitted.profile.median_abs_error < 1e-6
    probe = terms_of.of_chunks([(1500, 1, True)] * 20 + [(0, 300, True)])
    assert fitted.seconds(probe) == pytest.approx(truth.seconds(probe), rel=1e-6)


def test_tiled_path_counts_the_padded_tiles_the_engine_runs():
    """9 decode rows are two 8-row tiles, 65 prompt rows two 64-row tiles, and every chunk (sampling or not)
    sends its last row through the LM head; the napkin counts rows."""
    terms_of = TermsOf(model_spec("gemma-3-270m").shape("Q4_K_M"), 2, TORCH_PATH)
    step = [(100 + i, 1, True) for i in range(9)] + [(0, 65, False)]  # 9 decodes and a prompt's first chunk
    terms = terms_of.of_chunks(step)
    assert (terms.decode_tiles, terms.prompt_tiles, terms.logit_tiles) == (2, 2, 2)
    assert (terms.decode_rows, terms.prompt_rows, terms.logit_rows) == (9, 65, 9)
    napkin = TermsOf(model_spec("gemma-3-270m").shape("Q4_K_M"), 2).of_chunks(step)
    assert (napkin.decode_tiles, napkin.prompt_tiles, napkin.logit_tiles) == (9, 65, 9)
    assert [terms_of.of_chunks([(0, n, True)]).prompt_tiles for n in (2, 64, 128, 129)] == [1, 1, 2, 3]


def test_chunk_span_attention_pays_the_masked_rectangle_of_sliding_layers():
    """The torch path's one SDPA per chunk computes every (row, key) pair from the chunk's first attended key:
    past the window that is more than the napkin's causal, window-aware count; a decode row costs the same."""
    shape = model_spec("gemma-3-270m").shape("Q4_K_M")  # 15 of 18 layers slide over 512 tokens
    torch_path, napkin = TermsOf(shape, 2, TORCH_PATH), TermsOf(shape, 2)
    prompt = [(0, 2000, True)]
    per_pair = 4 * shape.num_heads * shape.head_dim
    assert torch_path.of_chunks(prompt).span_attention_flops == pytest.approx(per_pair * 2000 * 2000 * 18)
    assert torch_path.of_chunks(prompt).span_attention_flops > 2 * napkin.of_chunks(prompt).span_attention_flops
    decode = [(1500, 1, True)]
    assert torch_path.of_chunks(decode).span_attention_flops == pytest.approx(napkin.of_chunks(decode).attention_flops)


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama-profile")
    build_hf_model("llama", directory)
    save_tokenizer(directory)
    config = EngineConfig(model=str(directory), threads=torch.get_num_threads(),
                          kv_cache=KVCacheConfig(4, "bf16", 1 << 20),
                          scheduler=SchedulerConfig(max_num_batched_tokens=64))
    profile = measure(config, Grid(decode_rows=(1, 3), contexts=(8, 40), prefill_tokens=(4, 30)))
    path = profile.save(directory / "profile.json")
    return str(directory), profile, path


def test_profile_of_the_real_engine_drives_the_simulator(tiny_profile):
    model, profile, path = tiny_profile
    assert profile.samples >= 2 * len(TERMS) and all(c >= 0 for c in profile.coefficients)
    assert profile.stamp == current_stamp(profile.stamp.model, torch.get_num_threads())
    assert Profile.load(path) == profile
    assert len(profile.steps) == profile.samples  # what was fitted is kept beside the fit
    deploy = deployment(SimOptions(model, calibrated=True, profile=str(path), kv_cache_memory=1 << 20,
                                   scheduler=SchedulerConfig(max_num_batched_tokens=64)))
    assert deploy.step_time.path == of_this_engine()  # the simulator counts work as the profiled engine did
    result = simulate(deploy, synthetic(12, 20, 6, deploy.shape.vocab_size, rate=100.0))
    assert all(len(track.token_times) == 6 for track in result.tracks)
    assert result.duration_s > 0


@pytest.mark.parametrize("field, value", [("commit", "0" * 40), ("cpu", "Some Other CPU"), ("threads", 97)])
def test_a_profile_stamped_elsewhere_is_refused(tiny_profile, tmp_path, field, value):
    model, profile, _ = tiny_profile
    stale = dataclasses.replace(profile, stamp=dataclasses.replace(profile.stamp, **{field: value}))
    path = stale.save(tmp_path / "stale.json")
    with pytest.raises(RidgelineError, match=f"does not match this run: {field}"):
        deployment(SimOptions(model, calibrated=True, profile=str(path), kv_cache_memory=1 << 20))


def test_calibrated_and_roofline_choices_are_checked():
    with pytest.raises(RidgelineError, match="give --hardware"):
        deployment(SimOptions("llama-3.1-8b"))
    with pytest.raises(RidgelineError, match="drop --hardware"):
        deployment(SimOptions("llama-3.1-8b", hardware="nvidia-h100-sxm", calibrated=True))
    with pytest.raises(RidgelineError, match="does not fit"):
        deployment(SimOptions("llama-3.3-70b", "BF16", "nvidia-h100-sxm"))
