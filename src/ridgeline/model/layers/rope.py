"""Rotary position embedding, rotate-half (NeoX) layout; the GGUF loader reorders llama rows to match."""

import torch


class RotaryEmbedding:
    def __init__(self, head_dim: int, theta: float, linear_factor: float = 1.0,
                 frequency_divisors: torch.Tensor | None = None, device: torch.device | None = None):
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        if frequency_divisors is not None:  # Llama 3.1 scaling, stored as GGUF's rope_freqs
            inv_freq = inv_freq / frequency_divisors.double()
        self.inv_freq = (inv_freq / linear_factor).float().to(device)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of shape [T, 1, head_dim], both halves alike: computed once per forward pass, shared by all layers."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)[:, None, :]
        return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]. (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), computed in fp32 as whole rows."""
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)
