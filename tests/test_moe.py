"""Mixture-of-experts layers: a step runs only the experts its rows were routed to, each once over exactly its rows,
and gives every row what the row's own top-k experts give (both routings: Qwen3-MoE's softmax-then-top-k with
renormalisation, gpt-oss's top-k-then-softmax), in ragged batches of prompt and generated rows."""

import pytest
import torch
from gguf import GGMLQuantizationType

from ridgeline.model.layers.linear import make_linear
from ridgeline.model.row_paths import RowPaths
from ridgeline.model.layers.mlp import GatedMLP
from ridgeline.model.layers.moe import MixtureOfExperts
from ridgeline.model.layers.shared_input import SharedInputLinear
from ridgeline.model.weights import StoredTensor

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 32, 16, 32, 2
CPU = torch.device("cpu")


def stored(*shape: int, scale: float = 0.5) -> StoredTensor:
    data = torch.randn(*shape) * scale
    return StoredTensor(GGMLQuantizationType.F32, tuple(shape), data)


def moe_layer(routing: str, activation: str) -> MixtureOfExperts:
    torch.manual_seed(0)
    router = make_linear(stored(EXPERTS, HIDDEN), stored(EXPERTS), "f32", CPU)
    experts = [GatedMLP(SharedInputLinear([stored(INTERMEDIATE, HIDDEN), stored(INTERMEDIATE, HIDDEN)],
                                          [stored(INTERMEDIATE), None], "f32", CPU),
                        make_linear(stored(HIDDEN, INTERMEDIATE), stored(HIDDEN), "f32", CPU), activation)
               for _ in range(EXPERTS)]
    return MixtureOfExperts(router, experts, TOP_K, routing, norm_topk_prob=True)


def expected_row(layer: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """One row from the definition: the router's weights over all experts, its top k, their outputs mixed."""
    logits = layer.router(x[None], RowPaths.memory_bound(1))[0]
    if layer.routing == "topk_softmax":
        top, chosen = logits.topk(TOP_K)
        weights = top.softmax(0)
    else:
        weights, chosen = logits.softmax(0).topk(TOP_K)
        weights = weights / weights.sum()
    return sum(w * layer.experts[e](x[None], RowPaths.memory_bound(1))[0] for w, e in zip(weights, chosen.tolist()))


@pytest.mark.parametrize("routing,activation", [("softmax_topk", "silu"), ("topk_softmax", "swiglu_oai")])
def test_each_routed_expert_runs_once_over_exactly_its_rows(routing, activation):
    layer = moe_layer(routing, activation)
    rows = 13
    x = torch.randn(rows, HIDDEN)
    # a ragged step: generated rows (decodes) between prompt rows of two chunks
    is_prompt = torch.tensor([True] * 5 + [False, False] + [True] * 5 + [False])
    paths = RowPaths.from_prompt_mask(is_prompt)
    calls: dict[int, list[int]] = {}
    for index, expert in enumerate(layer.experts):
        def record(x, paths, index=index, forward=expert.forward):
            calls.setdefault(index, []).append(x.shape[0])
            assert paths.num_rows == x.shape[0]
            return forward(x, paths)
        expert.forward = record

    out = layer(x, paths)
    chosen, _ = layer.route(x, paths)
    routed_rows = torch.bincount(chosen.reshape(-1), minlength=EXPERTS)
    assert sorted(calls) == layer.last_routed == routed_rows.nonzero().squeeze(1).tolist()
    assert {e: sizes for e, sizes in calls.items()} == {e: [int(routed_rows[e])] for e in layer.last_routed}
    assert len(layer.last_routed) < EXPERTS  # this batch leaves some experts unread
    for expert in layer.experts:
        del expert.forward
    for row in range(rows):
        torch.testing.assert_close(out[row], expected_row(layer, x[row]), rtol=1e-5, atol=1e-5)


def test_a_single_decode_row_reads_k_experts():
    layer = moe_layer("topk_softmax", "swiglu_oai")
    layer(torch.randn(1, HIDDEN), RowPaths.memory_bound(1))
    assert len(layer.last_routed) == TOP_K


def test_clamped_swiglu_clamps_gate_from_above_and_up_on_both_sides():
    from ridgeline.model.layers.mlp import clamped_swiglu

    gate = torch.tensor([-20.0, 0.5, 20.0])
    up = torch.tensor([-20.0, 0.5, 20.0])
    out = clamped_swiglu(gate, up, alpha=1.702, limit=7.0)
    g = torch.tensor([-20.0, 0.5, 7.0])
    u = torch.tensor([-7.0, 0.5, 7.0])
    torch.testing.assert_close(out, (u + 1) * g * torch.sigmoid(1.702 * g))
