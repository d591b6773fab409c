"""One interface for every step-time model: a scheduled step in, its duration in seconds out.

A step is reduced to the roofline's terms (StepTerms) once; the roofline model prices them with a machine's
ceilings, the calibrated model with coefficients fitted to this machine's measured steps. Both see only what
the scheduler decided (chunk starts and lengths), never tokens. The tile and span terms count the work as a
given engine path does it (sim/engine_path.py); on the napkin's path they equal the per-row counts.
"""

from dataclasses import dataclass
from typing import Protocol

from ridgeline.engine.scheduler import SchedulerOutput
from ridgeline.engine.step_record import StepRecord
from ridgeline.napkin.model_shape import ModelShape
from ridgeline.sim.engine_path import NAPKIN, EnginePath


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
    prompt_rows: int = 0  # rows of prompt chunks (the rest of `tokens` are decode rows)
    decode_tiles: int = 0  # matmul tiles of decode rows, prompt rows and LM-head rows on the engine's path
    prompt_tiles: int = 0
    logit_tiles: int = 0
    span_attention_flops: float = 0.0  # attention FLOPs as the engine's path computes them (masked keys included)
    prompt_attention_flops: float = 0.0  # the part of span_attention_flops that prompt chunks compute

    @property
    def flops(self) -> float:
        return self.body_flops + self.lm_head_flops + self.attention_flops


class StepTimeModel(Protocol):
    name: str
    path: EnginePath  # how the steps it prices count their work (TermsOf)

    def seconds(self, terms: StepTerms) -> float: ...


class TermsOf:
    """Turns scheduler outputs into StepTerms for one model shape, with the napkin's per-token formulas."""

    def __init__(self, shape: ModelShape, kv_dtype_bytes: float, path: EnginePath = NAPKIN):
        self.shape, self.kv_dtype_bytes, self.path = shape, kv_dtype_bytes, path
        self.body_flops_per_token = shape.matmul_flops(1, 0)  # a row that stops after the last layer
        self.lm_flops_per_row = shape.matmul_flops(0, 1)
        self.kv_bytes_per_token = shape.kv_bytes_per_token(kv_dtype_bytes)
        # Decode attention FLOPs and KV reads are both the napkin's per-position figures times the positions a
        # row attends (window-aware): take the factors once, so a step costs one attended_positions per chunk.
        self.flops_per_position = shape.attention_flops_per_token(1) / shape.attended_positions(1)
        self.kv_bytes_per_position = shape.kv_bytes_for_context(1, kv_dtype_bytes) / shape.attended_positions(1)
        self.full_layers = shape.num_layers - shape.num_sliding_layers

    def __call__(self, plan: SchedulerOutput) -> StepTerms:
        return self.of_chunks(plan.step_chunks)

    def of_record(self, record: StepRecord) -> StepTerms:
        """The same terms for a step the engine recorded (GET /v1/steps): its chunks are kept in the record."""
        return self.of_chunks(list(record.chunks))

    def of_chunks(self, chunks: list[tuple[int, int, bool]]) -> StepTerms:
        """(start, num_tokens, samples) per chunk: start tokens are already cached, num_tokens are computed."""
        shape, attended = self.shape, self.shape.attended_positions
        tokens = logit_rows = decode_rows = 0
        decode_positions = cached_positions = span_positions = prompt_span_positions = 0
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
            span = num * self._key_span(start, num)
            span_positions += span
            if num > 1:
                prompt_span_positions += span
        attention = prefill_attention + decode_positions * self.flops_per_position
        path, prompt_rows = self.path, tokens - decode_rows
        head_rows = len(chunks) if path.logits_every_chunk else logit_rows
        return StepTerms(tokens, logit_rows, len(chunks), decode_rows, tokens * self.body_flops_per_token,
                         logit_rows * self.lm_flops_per_row, attention,
                         cached_positions * self.kv_bytes_per_position, tokens * self.kv_bytes_per_token,
                         prompt_rows, path.tiles(decode_rows, path.decode_tile),
                         path.tiles(prompt_rows, path.prompt_tile), path.tiles(head_rows, path.logit_tile),
                         span_positions * self.flops_per_position if path.chunk_span_attention else attention,
                         prompt_span_positions * self.flops_per_position if path.chunk_span_attention
                         else prefill_attention)

    def _key_span(self, start: int, num: int) -> int:
        """Keys summed over layers that one masked call per chunk covers: from the first row's first attended
        position to the last row's own (a sliding-window layer's first row reaches back one window)."""
        end, window = start + num, self.shape.sliding_window
        sliding = end - max(0, start + 1 - window) if window else end
        return self.full_layers * end + self.shape.num_sliding_layers * sliding
