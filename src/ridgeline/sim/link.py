"""The link that carries a prompt's KV from a prefill replica to a decode replica."""

from dataclasses import dataclass

from ridgeline.errors import RidgelineError


@dataclass(frozen=True)
class Link:
    bandwidth: float = 50e9  # bytes/s (default: a 400 Gb/s RDMA NIC)
    latency_s: float = 20e-6

    def __post_init__(self) -> None:
        if self.bandwidth <= 0 or self.latency_s < 0:
            raise RidgelineError(f"the KV link needs a positive bandwidth and a latency >= 0, got {self}")

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth
