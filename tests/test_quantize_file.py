"""`ridgeline quantize`: matrices requantised with gguf's quantisers, norms and metadata kept, the result loads
and answers like the original."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from ridgeline.engine.llm import LLM
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.errors import RidgelineError
from ridgeline.model.quant.quantize_file import quantize_gguf
from server_helpers import tiny_model_path


@pytest.mark.parametrize("fmt,qtype", [("q8_0", GGMLQuantizationType.Q8_0), ("q4_1", GGMLQuantizationType.Q4_1)])
def test_matrices_are_requantised_and_norms_kept(tmp_path, fmt, qtype):
    source = tiny_model_path()
    report = quantize_gguf(source, tmp_path / "out.gguf", fmt)
    before, after = GGUFReader(source), GGUFReader(tmp_path / "out.gguf")
    assert report.bytes_after < report.bytes_before
    original = {t.name: t for t in before.tensors}
    for tensor in after.tensors:
        if len(tensor.shape) == 1:
            assert tensor.tensor_type == original[tensor.name].tensor_type
            assert np.array_equal(tensor.data, original[tensor.name].data)
        else:
            assert tensor.tensor_type == qtype
    assert report.tensors_requantized == sum(1 for t in after.tensors if len(t.shape) == 2)
    for key in ("tokenizer.chat_template", "tokenizer.ggml.tokens", "llama.context_length"):
        assert after.fields[key].contents() == before.fields[key].contents()


def _prompt_logprobs(path, tokens: list[int]) -> np.ndarray:
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    output = LLM(str(path)).generate(tokens, params, use_tqdm=False)[0]
    return np.array([entry.logprob for entry in output.prompt_logprobs])


def test_tiers_score_text_like_the_original_closer_the_more_bits(tmp_path):
    tokens = np.random.default_rng(0).integers(3, 320, 64).tolist()
    original = _prompt_logprobs(tiny_model_path(), tokens)
    errors = {}
    for fmt in ("q8_0", "q4_0"):
        quantize_gguf(tiny_model_path(), tmp_path / f"{fmt}.gguf", fmt)
        errors[fmt] = float(np.abs(_prompt_logprobs(tmp_path / f"{fmt}.gguf", tokens) - original).mean())
    assert errors["q8_0"] < 0.05 * np.abs(original).mean()
    assert errors["q8_0"] < errors["q4_0"]


def test_k_quant_blocks_read_back_through_gguf_dequantisers():
    from gguf import quants

    from ridgeline.model.quant.kquants import quantize_q4_k, quantize_q6_k

    weights = np.random.default_rng(0).normal(0, 0.02, (32, 512)).astype(np.float32)
    weights[3, :256] = 0.0  # an all-zero block must not divide by zero

    def relative_error(blocks, qtype) -> float:
        back = quants.dequantize(blocks, qtype)
        assert back.shape == weights.shape
        return float(np.abs(back - weights).mean() / np.abs(weights).mean())

    q4_0 = relative_error(quants.quantize(weights, GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)
    q8_0 = relative_error(quants.quantize(weights, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    q4_k = relative_error(quantize_q4_k(weights), GGMLQuantizationType.Q4_K)
    q6_k = relative_error(quantize_q6_k(weights), GGMLQuantizationType.Q6_K)
    assert q4_k < 1.05 * q4_0  # a layout mistake would give errors of order 1
    assert q8_0 < q6_k < q4_k / 2
    assert np.all(quants.dequantize(quantize_q6_k(weights), GGMLQuantizationType.Q6_K)[3, :256] == 0)


def test_bad_requests_are_refused_clearly(tmp_path):
    with pytest.raises(RidgelineError, match="unknown quantisation type"):
        quantize_gguf(tiny_model_path(), tmp_path / "x.gguf", "q3_z")
    with pytest.raises(RidgelineError, match="no such GGUF"):
        quantize_gguf(tmp_path / "missing.gguf", tmp_path / "x.gguf", "q8_0")
