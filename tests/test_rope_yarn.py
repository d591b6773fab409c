"""YaRN RoPE (gpt-oss) gives transformers' frequencies and attention factor, with the ramp's ends rounded to whole
dimensions (llama.cpp, and so every GGUF) or not (gpt-oss's HF config says truncate: false)."""

import pytest
import torch

from ridgeline.model.config import YarnScaling
from ridgeline.model.layers.rope import RotaryEmbedding


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("head_dim,theta,factor,original", [(64, 150_000.0, 32.0, 4096), (32, 10_000.0, 4.0, 64)])
def test_yarn_matches_transformers(truncate, head_dim, theta, factor, original):
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": original, "truncate": truncate}
    config = GptOssConfig(hidden_size=64, num_attention_heads=2, head_dim=head_dim, rope_parameters=rope,
                          max_position_embeddings=original * int(factor))
    expected_freq, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    ours = RotaryEmbedding(head_dim, theta, yarn=YarnScaling(factor, original, 32.0, 1.0, truncate))
    torch.testing.assert_close(ours.inv_freq, expected_freq, rtol=1e-6, atol=0)
    assert ours.magnitude == pytest.approx(expected_factor)
    positions = torch.arange(0, 512, 7)  # angles small enough that fp32 rounding of the frequencies stays below 1e-4
    cos, sin = ours.cos_sin(positions)
    angles = positions[:, None].float() * expected_freq[None]
    torch.testing.assert_close(cos[:, 0, : head_dim // 2], angles.cos() * expected_factor, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(sin[:, 0, head_dim // 2:], angles.sin() * expected_factor, rtol=1e-4, atol=1e-4)
