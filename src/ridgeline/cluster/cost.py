"""A request's predicted cost on one replica, in seconds: wait for the prompts ahead of it, prefill the part of
its own prompt the replica has not cached, and decode the output it is expected to produce."""

from dataclasses import dataclass

from ridgeline.cluster.load import ReplicaLoad
from ridgeline.cluster.rates import Rates

# Decode streams sharing a step: per-stream speed holds while decode is memory-bound and sinks as the batch grows;
# at this many concurrent decodes the step is taken to cost twice a lone decode's.
DECODE_BATCH_KNEE = 16


@dataclass(frozen=True)
class Cost:
    queue_s: float
    prefill_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        return self.queue_s + self.prefill_s + self.decode_s


def predict(rates: Rates, load: ReplicaLoad, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> Cost:
    return Cost(
        queue_s=load.prefill_backlog / rates.prefill_tokens_per_s,
        prefill_s=rates.prefill_fixed_s + max(0, prompt_tokens - cached_tokens) / rates.prefill_tokens_per_s,
        decode_s=output_tokens / rates.decode_tokens_per_s * (1 + load.num_decoding / DECODE_BATCH_KNEE),
    )
