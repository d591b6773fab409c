"""Rotary position embedding, rotate-half (NeoX) layout; the GGUF loader reorders llama rows to match."""

import math

import torch

from ridgeline.model.config import YarnScaling


class RotaryEmbedding:
    def __init__(self, head_dim: int, theta: float, linear_factor: float = 1.0,
                 frequency_divisors: torch.Tensor | None = None, device: torch.device | None = None,
                 yarn: YarnScaling | None = None):
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        if frequency_divisors is not None:  # Llama 3.1 scaling, stored as GGUF's rope_freqs
            inv_freq = inv_freq / frequency_divisors.double()
        self.magnitude = 1.0  # YaRN scales cos and sin (and so every attention score) by its attention factor
        if yarn is not None:
            inv_freq, self.magnitude = yarn_frequencies(inv_freq, head_dim, theta, yarn)
        self.inv_freq = (inv_freq / linear_factor).float().to(device)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of shape [T, 1, head_dim], both halves alike: computed once per forward pass, shared by all layers."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)[:, None, :]
        if self.magnitude != 1.0:
            return angles.cos() * self.magnitude, angles.sin() * self.magnitude
        return angles.cos(), angles.sin()


def yarn_frequencies(inv_freq: torch.Tensor, head_dim: int, theta: float, yarn: YarnScaling) -> tuple[torch.Tensor, float]:
    """YaRN: frequencies that turn fewer than beta_slow times over the original context are divided by `factor`,
    those turning more than beta_fast times are kept, and a linear ramp over the dimensions between blends them.
    Returns the new frequencies and the attention factor (0.1 ln(factor) + 1)."""

    def dimension_turning(rotations: float) -> float:  # the dimension whose frequency turns `rotations` times
        return head_dim * math.log(yarn.original_context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension_turning(yarn.beta_fast), dimension_turning(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    kept = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    blended = inv_freq / yarn.factor * (1 - kept) + inv_freq * kept
    return blended, (0.1 * math.log(yarn.factor) + 1.0 if yarn.factor > 1 else 1.0)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]. (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), computed in fp32 as whole rows."""
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)
