"""The decode-step profile (bench/step_profile.py) splits a step into parts that add up to it: every matmul of the
model by role, with the bytes of weight it streams, the rest of the model, and what the engine does outside it.
Nothing here is timed against a bound; only the accounting is checked."""

from server_helpers import tiny_model_path

from ridgeline.bench.step_profile import MODEL, OUTSIDE, StepProfiler, format_profile, matmul_bytes
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams


def test_a_profiled_step_is_split_into_parts_that_add_up_and_count_every_weight_byte_once():
    llm = LLMEngine(EngineConfig(model=str(tiny_model_path()), kv_cache=KVCacheConfig(16, "fp32", 8 << 20)))
    llm.add_request("a", [5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    llm.step()  # prefill
    model = llm.runner.model
    with StepProfiler(model) as profiler:
        while llm.has_unfinished():
            with profiler.step():
                llm.step()
    assert "forward" not in vars(model), "the wrappers are gone afterwards"
    profile = profiler.profile
    assert profile.steps == 5
    parts = profile.per_step()
    roles = {name.split(" (")[0] for name, part in parts.items() if part.weight_bytes}
    assert roles == {"q/k/v", "o", "gate/up", "down", "LM head"}
    layers = model.config.num_layers
    assert sum(p.calls for n, p in parts.items() if n.startswith("LM head")) == 1
    assert sum(p.calls for n, p in parts.items() if n.startswith("down")) == layers
    linears = [m for m in model.modules() if matmul_bytes(m)]
    assert sum(p.weight_bytes for p in parts.values()) == sum(matmul_bytes(m) for m in linears)
    assert abs(sum(p.seconds for p in profile.parts.values()) - profile.step_seconds) < 1e-6
    assert parts[OUTSIDE].calls == 1 and parts[MODEL].calls == 1
    table = format_profile(profile, bandwidth=10e9, title="tiny")
    assert "all matmuls" in table and "LM head" in table
