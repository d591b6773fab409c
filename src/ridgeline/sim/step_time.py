"""One interface for every step-time model: a scheduled step in, its duration in seconds out.

A step is reduced to the roofline's terms (StepTerms) once; the roofline model prices them with a machine's
ceilings, the calibrated model with coefficients fitted to this machine's measured steps. Both see only what
the scheduler decided (chunk starts and lengths), never tokens.
"""

from dataclasses import dataclass
from typing import Protocol

from ridgeline.engine.scheduler import SchedulerOutput
from ridgeline.napkin.model_shape import ModelShape


@dataclass(frozen=True)
class StepTerms:
    tokens: int  # rows through the weight matmuls (prefill chunk tokens + decode rows)
    logit_rows: int  # rows through the LM head: only chunks that sample compute logits
    chunks: int  # sequences in the step (per-sequence metadata and attention calls)
    decode_rows: int
    body_flops: float  # weight matmuls except the LM head
    lm_head_flops: float
    attention_flops: float  # Q.K^T and scores.V over every row's attended positions
    kv_read_bytes: float  # each sequence's cached KV, read once by its chunk
    kv_write_bytes: float  # the KV of the step's new tokens

    @property
    def flops(self) -> float:
        return self.body_flops + self.lm_head_flops + self.attention_flops


class StepTimeModel(Protocol):
    name: str

    def seconds(self, terms: StepTerms) -> float: ...


class TermsOf:
    """Turns scheduler outputs into StepTerms for one model shape, with the napkin's per-token formulas."""

    def __init__(self, shape: ModelShape, kv_dtype_bytes: float):
        self.shape, self.kv_dtype_bytes = shape, kv_dtype_bytes
        self.lm_flops_per_row = 2 * shape.lm_head.params
        self.body_flops_per_token = shape.matmul_flops_per_token() - self.lm_flops_per_row
        self.kv_bytes_per_token = shape.kv_bytes_per_token(kv_dtype_bytes)
        # Decode attention FLOPs and KV reads are both the napkin's per-position figures times the positions a
        # row attends (window-aware): take the factors once, so a step costs one attended_positions per chunk.
        self.flops_per_position = shape.attention_flops_per_token(1) / shape.attended_positions(1)
        self.kv_bytes_per_position = shape.kv_bytes_for_context(1, kv_dtype_bytes) / shape.attended_positions(1)

    def __call__(self, plan: SchedulerOutput) -> StepTerms:
        return self.of_chunks([(chunk.start, chunk.num_tokens, chunk.samples) for chunk in plan.chunks])

    def of_chunks(self, chunks: list[tuple[int, int, bool]]) -> StepTerms:
        """(start, num_tokens, samples) per chunk: start tokens are already cached, num_tokens are computed."""
        shape, attended = self.shape, self.shape.attended_positions
        tokens = logit_rows = decode_rows = 0
        decode_positions = cached_positions = 0
        prefill_attention = 0.0
        for start, num, samples in chunks:
            tokens += num
            logit_rows += samples
            if num == 1:
                decode_rows += 1
                decode_positions += attended(start + 1)
            else:  # rows start..start+num-1, each over the positions before it: the prompt's pairs minus the cached part's
                prefill_attention += shape.prefill_attention_flops(start + num) - shape.prefill_attention_flops(start)
            if start:
                cached_positions += attended(start)
        return StepTerms(tokens, logit_rows, len(chunks), decode_rows, tokens * self.body_flops_per_token,
                         logit_rows * self.lm_flops_per_row, prefill_attention + decode_positions * self.flops_per_position,
                         cached_positions * self.kv_bytes_per_position, tokens * self.kv_bytes_per_token)
