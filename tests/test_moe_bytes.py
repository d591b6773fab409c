"""A decode step of an MoE model reads the shared weights and only the experts its token was routed to, counted by
the engine from the model it loaded (model/step_bytes.py); on a tiny gpt-oss with gpt-oss-120b's expert layout
(128 experts, 4 per token) that count is the roofline's figure for the same shape, and scaled by gpt-oss-120b's
config it gives the roofline's gpt-oss-120b figure."""

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from tiny_models import build_hf_model, write_gguf

from ridgeline.bench.bench_latency import napkin_weight_bytes
from ridgeline.engine.assemble import assemble_model
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.model.attention_batch import ForwardChunk
from ridgeline.model.checkpoint import Checkpoint, read_checkpoint
from ridgeline.model.config import ModelConfig
from ridgeline.model.step_bytes import StepBytes, last_step_bytes
from ridgeline.model.transformer import ModelOptions
from ridgeline.model.weights import SUPPORTED_TYPES, StoredTensor
from ridgeline.napkin.model_specs import ModelSpec, model_spec

REAL = model_spec("gpt-oss-120b")
# gpt-oss-120b's counts (experts, experts per token, heads per KV head, alternating windows), small widths
TINY = ModelSpec("tiny-gpt-oss", vocab_size=256, hidden_size=64, intermediate_size=32, num_layers=2, num_heads=8,
                 num_kv_heads=1, head_dim=32, max_context=256, reported_params=0, source="test",
                 num_experts=REAL.num_experts, experts_per_token=REAL.experts_per_token,
                 sliding_window=16, num_sliding_layers=1)


def tiny_checkpoint() -> Checkpoint:
    spec = TINY
    config = ModelConfig(
        architecture="gpt-oss", vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_layers=spec.num_layers, num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, max_context=spec.max_context, rms_norm_eps=1e-5,
        rope_theta=150_000.0, sliding_window=spec.sliding_window, sliding_layers=(0,), attention_bias=True,
        attention_sinks=True, activation="swiglu_oai", num_experts=spec.num_experts,
        experts_per_token=spec.experts_per_token, expert_intermediate_size=spec.intermediate_size,
        routing="topk_softmax")
    generator = torch.Generator().manual_seed(0)
    hidden, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    experts, inter = spec.num_experts, spec.intermediate_size
    shapes = {"token_embd.weight": (spec.vocab_size, hidden), "output.weight": (spec.vocab_size, hidden),
              "output_norm.weight": (hidden,)}
    for i in range(spec.num_layers):
        shapes |= {f"blk.{i}.{name}": shape for name, shape in {
            "attn_norm.weight": (hidden,), "ffn_norm.weight": (hidden,), "attn_sinks.weight": (spec.num_heads,),
            "attn_q.weight": (q, hidden), "attn_q.bias": (q,), "attn_k.weight": (kv, hidden), "attn_k.bias": (kv,),
            "attn_v.weight": (kv, hidden), "attn_v.bias": (kv,), "attn_output.weight": (hidden, q),
            "attn_output.bias": (hidden,), "ffn_gate_inp.weight": (experts, hidden), "ffn_gate_inp.bias": (experts,),
            "ffn_gate_exps.weight": (experts, inter, hidden), "ffn_gate_exps.bias": (experts, inter),
            "ffn_up_exps.weight": (experts, inter, hidden), "ffn_up_exps.bias": (experts, inter),
            "ffn_down_exps.weight": (experts, hidden, inter), "ffn_down_exps.bias": (experts, hidden)}.items()}
    tensors = {name: StoredTensor(GGMLQuantizationType.BF16, shape,
                                  (torch.randn(shape, generator=generator) * 0.3).to(torch.bfloat16))
               for name, shape in shapes.items()}
    return Checkpoint(Path("tiny-gpt-oss"), config, tensors, None)


def one_decode_step(source, options: ModelOptions) -> StepBytes:
    assembled = assemble_model(source, options, KVCacheConfig(block_size=4, dtype="fp32"), num_blocks=2)
    runner = assembled.runner
    runner.forward([ForwardChunk([7], 0, runner.kv_cache.group_tables([0]), num_prompt_tokens=0)])
    return last_step_bytes(runner.model, tokens=1)


@pytest.fixture(scope="module")
def tiny_step():
    return one_decode_step(tiny_checkpoint(), ModelOptions(weights="bf16"))


def test_a_decode_step_reads_k_of_the_experts(tiny_step):
    per_expert = 3 * TINY.hidden_size * TINY.intermediate_size * 2  # gate, up, down in bf16
    assert tiny_step.all_expert_matrices == TINY.num_layers * TINY.num_experts * per_expert
    assert tiny_step.routed_matrices == TINY.num_layers * TINY.experts_per_token * per_expert
    assert tiny_step.routed_vectors > 0 and tiny_step.shared_vectors > 0  # biases, norms and sinks counted apart


def test_engine_count_is_the_rooflines_figure_for_the_same_shape(tiny_step):
    assert tiny_step.matrices == TINY.shape("BF16").weight_bytes_read(1)


def test_engine_count_scaled_by_the_config_reproduces_gpt_oss_120b(tiny_step):
    """Bytes per parameter and the share of experts read, both as the engine counted them on the tiny model, applied
    to gpt-oss-120b's parameter counts, give the roofline's bytes per decode token for gpt-oss-120b."""
    tiny, real = TINY.shape("BF16"), REAL.shape("BF16")
    shared_per_param = (tiny_step.shared_matrices + tiny_step.embedding_rows) / (
        tiny.lm_head.params + tiny.dense.params + TINY.hidden_size)  # + one embedding row
    expert_per_param = tiny_step.all_expert_matrices / tiny.experts.params
    share_read = tiny_step.routed_matrices / tiny_step.all_expert_matrices
    assert share_read == REAL.experts_per_token / REAL.num_experts
    scaled = (shared_per_param * (real.lm_head.params + real.dense.params + REAL.hidden_size)
              + expert_per_param * share_read * real.experts.params)
    assert scaled == pytest.approx(real.weight_bytes_read(1), rel=1e-12)
    # 1 of 32 experts per layer: an active set of ~5.1B parameters out of ~117B (the model card's 5.13B / 116.83B)
    assert scaled / 2 == pytest.approx(5.13e9, rel=0.02)


def test_bench_latencys_napkin_figure_for_a_file_counts_only_the_routed_share(tmp_path):
    build = build_hf_model("gpt-oss", tmp_path)
    write_gguf(build, "gpt-oss", tmp_path / "model.gguf")
    checkpoint = read_checkpoint(tmp_path / "model.gguf")
    experts = sum(t.nbytes for n, t in checkpoint.tensors.items() if "_exps." in n)
    others = sum(t.nbytes for n, t in checkpoint.tensors.items() if "_exps." not in n and n != "token_embd.weight")
    embedding_row = checkpoint.tensors["token_embd.weight"].nbytes // checkpoint.config.vocab_size
    share = checkpoint.config.experts_per_token / checkpoint.config.num_experts
    assert napkin_weight_bytes(checkpoint, "quantized") == pytest.approx(others + embedding_row + share * experts)
    step = one_decode_step(tmp_path / "model.gguf", ModelOptions())  # f32 as stored
    assert step.routed_matrices == pytest.approx(share * sum(
        t.nbytes for n, t in checkpoint.tensors.items() if n.endswith("_exps.weight")))


@pytest.mark.skipif(GGMLQuantizationType.MXFP4 not in SUPPORTED_TYPES, reason="MXFP4 weights not read yet")
def test_mxfp4_experts_are_read_quantised_and_only_where_routed(tmp_path):
    """gpt-oss ships its experts in MXFP4: they stay packed per expert (a row of blocks is a plain byte slice), and
    a decode step still reads k/E of them; the logits follow the same weights dequantised at load."""
    build = build_hf_model("gpt-oss", tmp_path)
    write_gguf(build, "gpt-oss", tmp_path / "model.gguf", expert_type=GGMLQuantizationType.MXFP4)
    config = read_checkpoint(tmp_path / "model.gguf").config
    step = one_decode_step(tmp_path / "model.gguf", ModelOptions())
    assert step.routed_matrices * config.num_experts == step.all_expert_matrices * config.experts_per_token

    def logits(options: ModelOptions) -> torch.Tensor:
        runner = assemble_model(tmp_path / "model.gguf", options, KVCacheConfig(block_size=4, dtype="fp32"),
                                num_blocks=8).runner
        prompt = [5, 17, 99, 3, 250, 42, 42, 7, 300, 11, 64, 128]
        return runner.forward([ForwardChunk(prompt, 0, runner.kv_cache.group_tables(list(range(3))),
                                            all_logits=True)])[0]

    reference = logits(ModelOptions(weights="f32"))
    # With compiled kernels the packed path also rounds activations to int8 per 32 (as llama.cpp does), which on
    # this tiny random model moves a few logits by up to ~4 % of the largest; the f32 reference does not.
    torch.testing.assert_close(logits(ModelOptions()), reference, rtol=0.05, atol=0.08 * reference.abs().max().item())
