"""A mixture-of-experts feed-forward layer: a router picks k experts per token, their outputs are mixed by weight.

Decode is bound by the bytes it reads, and an MoE model's bytes are mostly experts, so a step must read only the
experts its tokens were routed to: rows are grouped by expert and each selected expert runs once over its rows
(gpt-oss-120b at batch 1 reads 4 of 128 experts a layer). Each expert is an ordinary GatedMLP over its own
(possibly quantised) weights, so every weight format the linear layers take serves experts too.

Batch invariance: a row's router logits, its experts' outputs (the linear layers give a row the same bits
whatever other rows share the call, RowPaths choosing its path by what the row is) and the mix of its k outputs
(summed in the row's own top-k order, never through a reduction shaped by the batch) do not depend on the batch.
"""

import torch
from torch import nn

from ridgeline.model.row_paths import RowPaths
from ridgeline.model.layers.mlp import GatedMLP


class MixtureOfExperts(nn.Module):
    def __init__(self, router: nn.Module, experts: list[GatedMLP], top_k: int, routing: str, norm_topk_prob: bool):
        super().__init__()
        self.router, self.experts = router, nn.ModuleList(experts)
        self.top_k, self.routing, self.norm_topk_prob = top_k, routing, norm_topk_prob
        self.last_routed: list[int] = []  # experts the last forward pass ran, for the bytes-per-step count

    def route(self, x: torch.Tensor, paths: RowPaths) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's k experts [T, k] (int64) and their weights [T, k] (fp32)."""
        logits = self.router(x, paths).float()
        if self.routing == "topk_softmax":  # gpt-oss: softmax over the k selected logits
            top, chosen = logits.topk(self.top_k, dim=-1)
            return chosen, top.softmax(dim=-1)
        weights, chosen = logits.softmax(dim=-1).topk(self.top_k, dim=-1)  # Qwen3-MoE: softmax over all experts
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return chosen, weights

    def forward(self, x: torch.Tensor, paths: RowPaths) -> torch.Tensor:
        chosen, weights = self.route(x, paths)
        rows, k = chosen.shape
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (row, slot) pairs grouped by expert
        counts = torch.bincount(flat, minlength=len(self.experts))
        routed = counts.nonzero().squeeze(1).tolist()
        self.last_routed = routed
        is_prompt = _prompt_mask(paths, rows)
        outputs = x.new_empty(rows * k, x.shape[1])
        start = 0
        for expert, count in zip(routed, counts[routed].tolist()):
            pairs = order[start:start + count]
            start += count
            members = pairs // k
            subset = (RowPaths(count, None, None, paths.all_compute) if is_prompt is None
                      else RowPaths.from_prompt_mask(is_prompt[members]))
            outputs[pairs] = self.experts[expert](x[members], subset)
        outputs = outputs.view(rows, k, -1)
        weights = weights.to(x.dtype)
        mixed = outputs[:, 0] * weights[:, :1]
        for slot in range(1, k):
            mixed = mixed + outputs[:, slot] * weights[:, slot:slot + 1]
        return mixed


def _prompt_mask(paths: RowPaths, rows: int) -> torch.Tensor | None:
    """Which rows are prompt rows, or None when all rows take the same path."""
    if paths.compute_rows is None:
        return None
    mask = torch.zeros(rows, dtype=torch.bool, device=paths.compute_rows.device)
    mask[paths.compute_rows] = True
    return mask
