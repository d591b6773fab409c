"""The compiled per-layer ops (RMSNorm with optional residual, RoPE, gated activations) against torch."""

import pytest
import torch
from torch import nn

from ridgeline.model.native import NO_TENSOR, compiled

needs_compiled = pytest.mark.skipif(compiled() is None, reason="no AVX-512 VNNI or no compiler here")


def rms_norm_reference(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@needs_compiled
@pytest.mark.parametrize("shape,weight_shape", [((1, 640), (640,)), ((37, 640), (640,)), ((5, 6, 256), (6, 256))])
def test_rms_norm_matches_torch_with_and_without_residual(shape, weight_shape):
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(shape, generator=generator) * 3, torch.randn(weight_shape, generator=generator)
    residual = torch.randn(shape, generator=generator)
    expected = rms_norm_reference(x, weight, 1e-6)
    torch.testing.assert_close(compiled().rms_norm(x, weight, 1e-6, NO_TENSOR), expected)
    torch.testing.assert_close(compiled().rms_norm(x, weight, 1e-6, residual), residual + expected)


@needs_compiled
def test_rope_matches_rotate_half():
    from ridgeline.model.layers.rope import RotaryEmbedding

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(9, 5, 64, generator=generator)
    cos, sin = RotaryEmbedding(64, 10000.0).cos_sin(torch.arange(100, 109))
    x1, x2 = x.chunk(2, dim=-1)
    expected = x * cos + torch.cat((-x2, x1), dim=-1) * sin
    torch.testing.assert_close(compiled().rope(x, cos, sin), expected)


@needs_compiled
@pytest.mark.parametrize("gelu", [True, False])
def test_gated_activation_matches_torch(gelu):
    generator = torch.Generator().manual_seed(2)
    gate, up = torch.randn(7, 2048, generator=generator) * 6, torch.randn(7, 2048, generator=generator)
    activation = (lambda g: nn.functional.gelu(g, approximate="tanh")) if gelu else nn.functional.silu
    torch.testing.assert_close(compiled().gated_activation(gate, up, gelu), activation(gate) * up, rtol=2e-6, atol=2e-6)


@needs_compiled
def test_a_rows_result_does_not_depend_on_the_other_rows():
    generator = torch.Generator().manual_seed(3)
    x, weight = torch.randn(300, 640, generator=generator), torch.randn(640, generator=generator)
    together = compiled().rms_norm(x, weight, 1e-6, NO_TENSOR)
    assert torch.equal(compiled().rms_norm(x[123:124].clone(), weight, 1e-6, NO_TENSOR)[0], together[123])
    gated = compiled().gated_activation(x, x.flip(0), True)
    assert torch.equal(compiled().gated_activation(x[7:8].clone(), x.flip(0)[7:8].clone(), True)[0], gated[7])
