"""Batch invariance of the mixture-of-experts models: on tiny random qwen3moe and gpt-oss GGUFs with Q8_0 experts,
each request's greedy tokens are the same run alone, run in one batch with the others (their rows share experts
and steps), and run with chunked prefill under a 16-token budget."""

import pytest
from gguf import GGMLQuantizationType
from tiny_models import MOE_ARCHITECTURES, build_hf_model, write_gguf

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm import LLM
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
# lengths around and past gpt-oss's 8-token window, some sharing a prefix
PROMPTS = [[(11 * i + 5 * k) % 370 + 3 for i in range(n)] for k, n in enumerate((3, 9, 17, 30, 1, 12))]
PROMPTS.append(PROMPTS[3][:20] + [1, 2, 3])


@pytest.fixture(scope="module", params=MOE_ARCHITECTURES)
def tiny_moe(request, tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp(request.param)
    model = build_hf_model(request.param, directory)
    write_gguf(model, request.param, directory / "model.gguf", expert_type=GGMLQuantizationType.Q8_0, tokenizer=True)
    return str(directory / "model.gguf")


def engine(model: str, budget: int = 256) -> LLM:
    config = EngineConfig(model=model, kv_cache=KVCacheConfig(block_size=4, dtype="fp32", memory_bytes=8 << 20),
                          scheduler=SchedulerConfig(max_num_batched_tokens=budget, enable_prefix_caching=False))
    return LLM(config=config)


def generate(llm: LLM, prompts) -> list[list[int]]:
    return [out.output_token_ids for out in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_batched_and_chunked_equal_alone(tiny_moe):
    llm = engine(tiny_moe)
    alone = [generate(llm, [prompt])[0] for prompt in PROMPTS]
    assert generate(llm, PROMPTS) == alone
    assert generate(engine(tiny_moe, budget=16), PROMPTS) == alone
