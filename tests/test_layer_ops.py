"""The compiled per-layer ops (RMSNorm with optional residual, QK-norm + RoPE + cache writes, gated activations)
against torch."""

import resource

import pytest
import torch
from compiled_kernels import needs_compiled
from torch import nn

from ridgeline.model.native import NO_TENSOR, compiled


def rms_norm_reference(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@needs_compiled
@pytest.mark.parametrize("shape,weight_shape", [((1, 640), (640,)), ((37, 640), (640,)), ((5, 6, 256), (256,))])
def test_rms_norm_matches_torch_with_and_without_residual(shape, weight_shape):
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(shape, generator=generator) * 3, torch.randn(weight_shape, generator=generator)
    residual = torch.randn(shape, generator=generator)
    expected = rms_norm_reference(x, weight, 1e-6)
    torch.testing.assert_close(compiled().rms_norm(x, weight, 1e-6, NO_TENSOR), expected)
    torch.testing.assert_close(compiled().rms_norm(x, weight, 1e-6, residual), residual + expected)


@needs_compiled
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_prepare_attention_matches_norm_rope_and_cache_writes(cache_dtype, qk_norm):
    from ridgeline.model.layers.rope import RotaryEmbedding, apply_rope

    generator = torch.Generator().manual_seed(1)
    tokens, heads, kv_heads, dim = 5, 4, 2, 64
    projected = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=generator)  # q, k, v side by side
    q, k, v = projected.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=1)
    q_weight, k_weight = torch.randn(dim, generator=generator), torch.randn(dim, generator=generator)
    cos, sin = RotaryEmbedding(dim, 10000.0).cos_sin(torch.arange(100, 100 + tokens))
    k_cache, v_cache = torch.zeros(32, kv_heads, dim, dtype=cache_dtype), torch.zeros(32, kv_heads, dim, dtype=cache_dtype)
    slots = torch.tensor([3, 17, 4, 30, 0])
    norms = (q_weight, k_weight, 1e-6) if qk_norm else (NO_TENSOR, NO_TENSOR, 0.0)
    queries = compiled().prepare_attention(q, k, v, *norms, cos, sin, k_cache, NO_TENSOR, v_cache, NO_TENSOR, slots)

    q_heads, k_heads = q.reshape(tokens, heads, dim), k.reshape(tokens, kv_heads, dim)
    if qk_norm:
        q_heads, k_heads = rms_norm_reference(q_heads, q_weight, 1e-6), rms_norm_reference(k_heads, k_weight, 1e-6)
    torch.testing.assert_close(queries, apply_rope(q_heads, cos, sin))
    torch.testing.assert_close(k_cache[slots], apply_rope(k_heads, cos, sin).to(cache_dtype))
    assert torch.equal(v_cache[slots], v.reshape(tokens, kv_heads, dim).to(cache_dtype))
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[slots] = False
    assert not k_cache[untouched].any() and not v_cache[untouched].any()


@needs_compiled
@pytest.mark.parametrize("gelu", [True, False])
def test_gated_activation_matches_torch(gelu):
    generator = torch.Generator().manual_seed(2)
    # column slices of one [rows, 2n] matrix, as the shared gate/up projection hands them over
    gate, up = (torch.randn(7, 4096, generator=generator) * 6).split(2048, dim=1)
    activation = (lambda g: nn.functional.gelu(g, approximate="tanh")) if gelu else nn.functional.silu
    torch.testing.assert_close(compiled().gated_activation(gate, up, gelu), activation(gate) * up, rtol=1e-5, atol=1e-5)


@needs_compiled
def test_a_rows_result_does_not_depend_on_the_other_rows():
    generator = torch.Generator().manual_seed(3)
    x, weight = torch.randn(300, 640, generator=generator), torch.randn(640, generator=generator)
    together = compiled().rms_norm(x, weight, 1e-6, NO_TENSOR)
    assert torch.equal(compiled().rms_norm(x[123:124].clone(), weight, 1e-6, NO_TENSOR)[0], together[123])
    gated = compiled().gated_activation(x, x.flip(0), True)
    assert torch.equal(compiled().gated_activation(x[7:8].clone(), x.flip(0)[7:8].clone(), True)[0], gated[7])


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def long_step_call(op: str):
    """One compiled op on a long prefill step's rows (9,216 rows, outputs of 36 MiB), as a call to repeat."""
    generator = torch.Generator().manual_seed(4)
    tokens, heads, dim = 9216, 4, 256
    if op == "rms_norm":
        x, weight = torch.randn(tokens, 1024, generator=generator), torch.randn(1024, generator=generator)
        return lambda: compiled().rms_norm(x, weight, 1e-6, NO_TENSOR)
    if op == "gated_activation":
        gate, up = torch.randn(tokens, 2048, generator=generator).split(1024, dim=1)
        return lambda: compiled().gated_activation(gate, up, True)
    k_cache, v_cache = torch.zeros(tokens, 1, dim, dtype=torch.bfloat16), torch.zeros(tokens, 1, dim, dtype=torch.bfloat16)
    if op == "prepare_attention":
        q, k, v = torch.randn(tokens, (heads + 2) * dim, generator=generator).split((heads * dim, dim, dim), dim=1)
        cos, sin = torch.ones(tokens, dim), torch.zeros(tokens, dim)
        slots = torch.arange(tokens)
        return lambda: compiled().prepare_attention(q, k, v, NO_TENSOR, NO_TENSOR, 0.0, cos, sin, k_cache, NO_TENSOR,
                                                    v_cache, NO_TENSOR, slots)
    # paged_attention: every row attends one key of its own, so the call is cheap and the output large
    q = torch.randn(tokens, heads, dim, generator=generator)
    block_tables = torch.arange(tokens // 16, dtype=torch.int32)[None]
    row_seq = torch.zeros(tokens, dtype=torch.int32)
    key_begin = torch.arange(tokens, dtype=torch.int32)
    return lambda: compiled().paged_attention(q, k_cache, NO_TENSOR, v_cache, NO_TENSOR, block_tables, row_seq,
                                              key_begin, key_begin + 1, 16, dim**-0.5, NO_TENSOR)


@needs_compiled
@pytest.mark.parametrize("op", ["rms_norm", "gated_activation", "prepare_attention", "paged_attention"])
def test_a_long_prefill_steps_outputs_are_reused_once_freed_without_page_faults(op):
    # Above glibc's largest mmap threshold (32 MiB) each such output was a fresh mapping, faulted in page by page
    # (~9,200 faults here): a burst's 8,192-row prefill step faulted 80,000-230,000 times. Kept by
    # csrc/large_buffers.h once freed, a buffer serves the next call of that size with no new mapping.
    call = long_step_call(op)
    expected = call().clone()
    call()  # made and freed: its buffer is kept
    before = minor_faults()
    again = call()
    faults = minor_faults() - before
    assert torch.equal(again, expected)
    assert faults < 1000, f"{faults} page faults writing a reused {again.numel() * 4 >> 20} MiB {op} output"
