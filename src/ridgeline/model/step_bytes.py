"""Weight bytes a forward step read, counted from the model as loaded (not from a formula).

A decode step streams every shared weight (attention, routers, norms, the LM head), the embedding rows of its
tokens, and of each mixture-of-experts layer only the experts its rows were routed to (MixtureOfExperts records
them). Matrices and vectors (norms, biases, sinks) are counted apart, because the napkin model (perf/) counts
matrices only.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ridgeline.model.layers.embedding import TokenEmbedding
from ridgeline.model.layers.moe import MixtureOfExperts
from ridgeline.model.layers.norm import RMSNorm

VECTOR_NAMES = ("bias", "sinks")


@dataclass(frozen=True)
class StepBytes:
    shared_matrices: int  # read every step whatever the tokens: attention, routers, LM head, dense MLPs
    shared_vectors: int
    routed_matrices: int  # the experts the step's rows were routed to
    routed_vectors: int
    all_expert_matrices: int  # every expert, for the share a step reads
    embedding_rows: int  # the step's tokens' rows of an embedding not shared with the LM head

    @property
    def total(self) -> int:
        return self.shared_matrices + self.shared_vectors + self.routed_matrices + self.routed_vectors + self.embedding_rows

    @property
    def matrices(self) -> int:
        """What the napkin model's weight_bytes_read counts: matrices and embedding rows."""
        return self.shared_matrices + self.routed_matrices + self.embedding_rows


def _tensors(module: nn.Module) -> dict[int, tuple[torch.Tensor, bool]]:
    """Every weight under `module` once (tied ones too), each with whether it is a vector (norm, bias, sink)."""
    found = {}
    for owner in module.modules():
        named = [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]
        for name, tensor in named:
            if tensor is not None:
                found[id(tensor)] = (tensor, isinstance(owner, RMSNorm) or name in VECTOR_NAMES)
    return found


def _split(tensors) -> tuple[int, int]:
    """(matrix bytes, vector bytes); a quantised matrix's planes (quants, scales) all count as the matrix."""
    matrices = vectors = 0
    for tensor, is_vector in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        vectors, matrices = (vectors + nbytes, matrices) if is_vector else (vectors, matrices + nbytes)
    return matrices, vectors


def last_step_bytes(model: nn.Module, tokens: int) -> StepBytes:
    """Bytes of weights the model's last forward pass over `tokens` tokens read."""
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    expert_tensors: dict[int, tuple[torch.Tensor, bool]] = {}
    routed: dict[int, tuple[torch.Tensor, bool]] = {}
    for layer in layers:
        last_routed = set(layer.last_routed)
        for index, expert in enumerate(layer.experts):
            tensors = _tensors(expert)
            expert_tensors.update(tensors)
            if index in last_routed:
                routed.update(tensors)
    shared = [t for key, t in _tensors(model).items() if key not in expert_tensors]
    shared_matrices, shared_vectors = _split(shared)
    routed_matrices, routed_vectors = _split(routed.values())
    all_expert_matrices, _ = _split(expert_tensors.values())
    rows = 0
    for embedding in (m for m in model.modules() if isinstance(m, TokenEmbedding)):
        if not isinstance(embedding.source, nn.Module):  # a stored matrix, read a row per token
            rows += tokens * embedding.source.nbytes // embedding.source.shape[0]
    return StepBytes(shared_matrices, shared_vectors, routed_matrices, routed_vectors, all_expert_matrices, rows)
