"""What `ridgeline inspect` reports: parameters and bytes by tensor type, and the KV-cache cost per token."""

from collections import defaultdict
from dataclasses import dataclass

from ridgeline.model.checkpoint import Checkpoint
from ridgeline.napkin.kv_dtypes import KV_DTYPES


@dataclass
class TypeBytes:
    type_name: str
    tensors: int
    parameters: int
    nbytes: int

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / self.parameters


@dataclass
class ModelSummary:
    by_type: list[TypeBytes]
    parameters: int
    nbytes: int
    kv_bytes_per_token: dict[str, float]  # by KV dtype


def summarize(checkpoint: Checkpoint) -> ModelSummary:
    groups: dict[str, list] = defaultdict(lambda: [0, 0, 0])
    for tensor in checkpoint.tensors.values():
        group = groups[tensor.qtype.name]
        group[0] += 1
        group[1] += tensor.numel
        group[2] += tensor.nbytes
    by_type = sorted((TypeBytes(name, *values) for name, values in groups.items()), key=lambda t: -t.nbytes)
    kv = {name: checkpoint.config.kv_bytes_per_token(dtype.bytes_per_value) for name, dtype in KV_DTYPES.items()
          if name != "fp16"}  # as many bytes as bf16
    return ModelSummary(by_type, sum(t.parameters for t in by_type), sum(t.nbytes for t in by_type), kv)
