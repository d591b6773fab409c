"""The napkin model reproduces every number in the source documents, and reads real files correctly."""

import pytest
from tiny_models import build_hf_model

from ridgeline.model.model_source import load_model_shape
from ridgeline.errors import RidgelineError
from ridgeline.model.checkpoint import read_checkpoint
from ridgeline.napkin.hardware import Hardware, catalogued, observations
from ridgeline.napkin.model_specs import MODEL_SPECS, model_spec
from ridgeline.napkin.roofline import REALISTIC_BAND, Roofline, decode_ceiling, ridge_point

GB = 1e9
GIB = 2**30
KIB = 2**10


def roofline(model: str, weights: str, machine: str) -> Roofline:
    return Roofline(model_spec(model).shape(weights), catalogued(machine))


def observed(machine: str, phase: str) -> float:
    (match,) = [o for o in observations() if o.machine == machine and o.phase == phase]
    return match.tokens_per_s


# --- "The decode arithmetic you can do on a napkin" -----------------------------------------------


def test_llama2_7b_q4_0_on_400_gb_s_has_a_104_4_tok_s_ceiling():
    assert round(decode_ceiling(400e9, 3.83e9), 1) == 104.4
    # The same from the spec: 6.74 B params at 4.5 bits is the 3.83 GB file, give or take llama.cpp's
    # Q6_K output matrix. A decode step reads one embedding row, not the whole table, so the modelled
    # ceiling sits a little (3%) above the document's file-size napkin.
    shape = model_spec("llama-2-7b").shape("Q4_0")
    assert shape.total_weight_bytes == pytest.approx(3.83 * GB, rel=0.02)
    modelled = roofline("llama-2-7b", "Q4_0", "apple-m1-max").decode().tokens_per_s
    assert 104.4 < modelled < 104.4 * 1.04


def test_real_decode_lands_at_roughly_40_to_60_percent_of_the_ceiling_on_apple_silicon():
    fractions = {
        machine: observed(machine, "decode") / decode_ceiling(catalogued(machine).bandwidth, 3.83 * GB)
        for machine in ("apple-m1-max", "apple-m2-max", "apple-m1-ultra", "apple-m2-ultra")
    }
    assert fractions["apple-m1-max"] == pytest.approx(0.586, abs=0.001)
    assert fractions["apple-m1-ultra"] == pytest.approx(0.401, abs=0.001)
    assert fractions["apple-m2-ultra"] == pytest.approx(0.451, abs=0.001)
    assert fractions["apple-m2-max"] == pytest.approx(0.632, abs=0.001)  # "roughly": a little above 60%
    assert all(REALISTIC_BAND[0] <= f <= REALISTIC_BAND[1] + 0.05 for f in fractions.values())


def test_ultra_parts_return_about_40_percent_more_decode_than_their_max_for_twice_the_bandwidth():
    for max_chip, ultra_chip, ratio in (("apple-m1-max", "apple-m1-ultra", 1.37), ("apple-m2-max", "apple-m2-ultra", 1.43)):
        assert catalogued(ultra_chip).bandwidth == 2 * catalogued(max_chip).bandwidth
        assert round(observed(ultra_chip, "decode") / observed(max_chip, "decode"), 2) == ratio


def test_fp16_to_4_bit_moves_the_decode_ceiling_by_roughly_4x():
    fp16 = roofline("llama-2-7b", "FP16", "apple-m1-max").decode().tokens_per_s
    q4_0 = roofline("llama-2-7b", "Q4_0", "apple-m1-max").decode().tokens_per_s
    # 16 bits -> 4 bits plus one fp16 scale per 32 weights: 16 / 4.5 = 3.56x, "roughly 4x".
    assert q4_0 / fp16 == pytest.approx(16 / 4.5, rel=1e-3)


# --- "Why big-FLOPs, small-bandwidth boxes disappoint" ------------------------------------------


def test_dgx_spark_gpt_oss_120b_mxfp4_ceiling_against_its_measured_decode_and_prefill():
    spark = roofline("gpt-oss-120b", "MXFP4", "nvidia-dgx-spark")
    shape = spark.shape
    # Experts in MXFP4 and the rest in Q8_0 is the llama.cpp file: 59.02 GiB.
    assert shape.total_weight_bytes == pytest.approx(59.02 * GIB, rel=0.01)
    assert shape.active_params == pytest.approx(5.13e9, rel=0.01)

    decode_measured, prefill_measured = observed("nvidia-dgx-spark", "decode"), observed("nvidia-dgx-spark", "prefill")
    assert round(prefill_measured / decode_measured) == 32  # "a 32x gap between the two phases"

    ceiling = spark.decode().tokens_per_s
    assert ceiling == pytest.approx(273e9 / 3.548e9, rel=0.01)  # only 4 of 128 experts are read per token
    fraction = decode_measured / ceiling
    assert fraction == pytest.approx(0.787, abs=0.01)
    assert fraction > REALISTIC_BAND[1]  # above the 40-60% band: the MoE's small active set streams well
    # "bandwidth / file size" would put the ceiling at ~4.3 tok/s, 14x below what the box measures.
    assert decode_measured > 10 * decode_ceiling(273e9, shape.total_weight_bytes)

    prefill = spark.prefill(2048)
    assert prefill.tokens_per_s > prefill_measured  # the modelled ceiling bounds the measurement
    assert prefill.tokens_per_s / ceiling > 32  # and the model shows the same phase gap, wider


# --- "Batching is why the API is cheap" --------------------------------------------------------


def test_h100_sxm_ridge_is_295_flop_per_byte():
    h100 = catalogued("nvidia-h100-sxm")
    assert h100.flops("fp16") == 989e12  # 1,979 with sparsity, halved
    assert round(ridge_point(989e12, 3.35e12)) == 295
    assert round(h100.ridge_point("fp16")) == 295


def test_fp16_decode_intensity_is_about_the_batch_and_turns_compute_bound_near_300_on_h100():
    h100 = roofline("llama-3.3-70b", "FP16", "nvidia-h100-sxm")
    for batch in (1, 8, 64):
        assert h100.decode_cost(batch).intensity == pytest.approx(batch, rel=0.01)
    assert h100.decode(64).bound == "memory"
    crossover = h100.compute_bound_batch()
    assert 295 <= crossover <= 300
    assert h100.decode_cost(crossover).intensity >= h100.ridge > h100.decode_cost(crossover - 1).intensity


def test_prefill_of_2000_tokens_has_intensity_about_2000_and_is_compute_bound_seven_times_over():
    h100 = roofline("llama-3.3-70b", "FP16", "nvidia-h100-sxm")
    prefill = h100.prefill_cost(2000)
    assert prefill.intensity == pytest.approx(2000, rel=0.03)
    assert h100.prefill(2000).bound == "compute"
    assert round(prefill.intensity / h100.ridge) == 7


def test_long_context_kv_traffic_can_keep_decode_memory_bound_at_any_batch():
    h100 = roofline("llama-3.3-70b", "FP16", "nvidia-h100-sxm")
    assert h100.compute_bound_batch(context=32768) is None


# --- "The KV cache is what grows" ----------------------------------------------------------------


def test_llama_3_3_70b_fp16_kv_cache():
    shape = model_spec("llama-3.3-70b").shape("FP16")
    assert shape.kv_bytes_per_token(2) == 327_680 == 320 * KIB
    assert round(shape.kv_bytes_for_context(131_072) / GB) == 43
    batch_32_at_8k = 32 * shape.kv_bytes_for_context(8192)
    assert round(batch_32_at_8k / GB) == 86
    assert batch_32_at_8k > catalogued("nvidia-h100-sxm").memory_bytes  # exceeds one 80 GB H100


def test_full_mha_would_cost_8x_what_gqa_does():
    shape = model_spec("llama-3.3-70b").shape("FP16")
    mha = shape.kv_bytes_per_token(2, num_kv_heads=shape.num_heads)
    assert mha == 2_621_440 == 2560 * KIB  # the document's "2.56 MiB" is 2,560 KiB (2.5 MiB, 2.62 MB)
    assert round(shape.kv_bytes_for_context(131_072, num_kv_heads=64) / GB) == 344  # "343 GB": 343.6
    assert mha / shape.kv_bytes_per_token(2) == 8


def test_memory_fit_is_the_largest_batch_and_context_whose_kv_fits_after_weights():
    h200 = roofline("llama-3.3-70b", "Q4_K_M", "nvidia-h200")
    free = h200.free_memory_bytes()
    assert free == pytest.approx(141e9 - h200.shape.total_weight_bytes)
    batch = h200.max_batch_at_context(8192)
    kv = h200.shape.kv_bytes_for_context(8192)
    assert batch * kv <= free < (batch + 1) * kv
    context = h200.max_context_at_batch(64)
    assert 64 * h200.shape.kv_bytes_for_context(context) <= free < 64 * h200.shape.kv_bytes_for_context(context + 1)
    assert roofline("llama-3.3-70b", "FP16", "nvidia-h100-sxm").free_memory_bytes() < 0  # 141 GB of FP16 weights


# --- specs and real files ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODEL_SPECS))
def test_spec_shapes_add_up_to_the_model_cards_parameter_count(name):
    spec = MODEL_SPECS[name]
    assert spec.shape().total_params == pytest.approx(spec.reported_params, rel=0.01)


def test_moe_decode_reads_only_the_routed_experts_and_big_batches_read_them_all():
    shape = model_spec("gpt-oss-120b").shape("MXFP4")
    assert shape.expert_fraction_read(1) == 4 / 128
    assert shape.expert_fraction_read(2048) == pytest.approx(1.0)
    untouched_embedding_rows = shape.embedding.nbytes * (1 - 2048 / shape.vocab_size)
    assert shape.weight_bytes_read(2048) == pytest.approx(shape.total_weight_bytes - untouched_embedding_rows, rel=1e-6)


def test_sliding_window_layers_keep_only_the_window():
    shape = model_spec("gemma-3-270m").shape("BF16")  # 3 global layers, 15 with a 512-token window
    per_layer_token = shape.kv_bytes_per_token(2) / 18
    assert shape.kv_bytes_for_context(32768) == per_layer_token * (3 * 32768 + 15 * 512)
    assert shape.kv_bytes_for_context(100) == 100 * shape.kv_bytes_per_token(2)


def test_a_real_gguf_is_measured_from_its_tensors_with_the_tied_embedding_counted_once():
    checkpoint = read_checkpoint(None)
    shape = load_model_shape(None)
    stored = sum(t.nbytes for t in checkpoint.tensors.values())
    assert shape.tied_embeddings
    assert shape.total_weight_bytes == stored
    embedding = checkpoint.tensors["token_embd.weight"]
    # A decode step multiplies by the whole (tied) embedding as the LM head and looks up one row.
    assert shape.weight_bytes_read(1) == pytest.approx(stored + embedding.nbytes / embedding.shape[0])
    assert shape.kv_bytes_per_token(2) == checkpoint.config.kv_bytes_per_token(2)
    assert shape.total_params == pytest.approx(model_spec("gemma-3-270m").reported_params, rel=0.01)


def test_a_decode_row_costs_its_prompt_token_plus_its_row_of_the_lm_head():
    shape = load_model_shape(None)  # Gemma 3 270M: 168M of its parameters are the (tied) embedding
    body = 2 * shape.dense.params
    assert shape.decode_row_flops_ratio() == pytest.approx((body + 2 * shape.lm_head.params) / body)
    assert 2.5 < shape.decode_row_flops_ratio() < 2.8
    assert model_spec("llama-2-7b").shape("Q4_K_M").decode_row_flops_ratio() == pytest.approx(1.0, abs=0.05)


def test_a_prompt_computes_logits_for_its_last_token_only():
    """An engine computes logits for the row it samples from: a prompt's last token. Counted for every prompt token,
    the LM head tripled Gemma 3 270M's prefill FLOPs, and put the engine's measured prompt steps above the roof."""
    r = Roofline(load_model_shape(None), catalogued("nvidia-h100-sxm"))
    shape, lm_head_row = r.shape, 2 * r.shape.lm_head.params
    cost = r.prefill_cost(1000)
    assert cost.flops == pytest.approx(1000 * 2 * shape.dense.params + lm_head_row + shape.prefill_attention_flops(1000))
    assert shape.matmul_flops(1000, 1000) == pytest.approx(1000 * shape.matmul_flops_per_token())  # all rows sample
    assert cost.flops < 0.45 * 1000 * shape.matmul_flops_per_token()  # the LM head is ~63 % of a decode row


def test_quantised_weights_take_the_machines_int8_roof_where_it_has_one():
    """A GGUF model's matmuls run as int8 dot products on the compiled kernels, so their roof is the machine's int8
    rate where one was measured (this-machine's, from those kernels). Float weights keep the float default, and so
    does every machine without an int8 figure (the catalogue's)."""
    cpu = Hardware("cpu", "a CPU", bandwidth=50e9, memory_bytes=16e9, default_precision="bf16",
                   dense_flops={"bf16": 350e9, "fp32": 200e9, "int8": 650e9})
    quantised, floats = model_spec("gemma-3-270m").shape("Q4_K_M"), model_spec("gemma-3-270m").shape("BF16")
    assert quantised.integer_weights and not floats.integer_weights
    assert (Roofline(quantised, cpu).precision, Roofline(quantised, cpu).peak_flops) == ("int8", 650e9)
    assert (Roofline(floats, cpu).precision, Roofline(floats, cpu).peak_flops) == ("bf16", 350e9)
    assert Roofline(quantised, cpu, "fp32").peak_flops == 200e9  # a precision asked for is the one used
    # A long prompt is compute-bound, so its ceiling moves with the roof it is under.
    assert Roofline(quantised, cpu).prefill(2048).tokens_per_s == pytest.approx(
        Roofline(quantised, cpu, "bf16").prefill(2048).tokens_per_s * 650 / 350)
    h100 = catalogued("nvidia-h100-sxm")
    assert Roofline(quantised, h100).precision == h100.default_precision == "bf16"


def test_a_files_weights_are_integer_when_most_of_its_matmul_bytes_are_quantised(tmp_path):
    assert load_model_shape(None).integer_weights  # Gemma 3 270M Q4_K_M: Q8_0, Q5_0, Q4_K and Q6_K blocks
    build_hf_model("llama", tmp_path)
    assert not load_model_shape(str(tmp_path)).integer_weights  # safetensors in fp32


def test_unknown_names_are_user_errors():
    with pytest.raises(RidgelineError, match="unknown weight format"):
        model_spec("llama-2-7b").shape("Q3_XYZ")
    with pytest.raises(RidgelineError, match="neither a file nor a built-in spec"):
        load_model_shape("no-such-model")
    with pytest.raises(RidgelineError, match="unknown hardware"):
        catalogued("nvidia-b300")
    with pytest.raises(RidgelineError, match="has no fp4"):
        catalogued("apple-m1-max").flops("fp4")
