"""The engine's own record of each step: what the forward pass computed, what it cost in the napkin model's
terms (bytes of weights and KV read, FLOPs) and how long it took, kept in a ring buffer of the last steps.

The costs come from the same per-token formulas as `ridgeline roofline` (ModelShape), applied to what the
scheduler actually batched: the weights are read once per step whatever the rows, a decode row at context c
reads c positions' KV and attends them, and a prefill chunk of n tokens starting at position s reads the
prefix's KV, writes its own, and attends causally. So a decode-only step at batch B costs exactly
`Roofline.decode_cost(B, c)` and a whole prompt in one chunk `Roofline.prefill_cost(L)`; a mixed step is the
sum of its rows with one read of the weights.

Each record also keeps what the simulator's step terms need (sim/step_time.py TermsOf.of_record: every decode
row's context, every prefill chunk's start, length and whether it samples) and whether the engine thread sat idle
before it (`after_idle`), so `ridgeline profile --through-server` can fit the step model on the time the server
really spends per step (bench/server_profile.py).

Recording runs on the engine thread after every forward pass, so it stays a few microseconds per row
(benchmarks/step_record_overhead.py measures it against the step); readers on other threads copy under a lock.
"""

import threading
import time
from collections import deque
from dataclasses import dataclass

from ridgeline.engine.scheduler import SchedulerOutput
from ridgeline.napkin.model_shape import ModelShape

DEFAULT_CAPACITY = 4096  # steps kept; a few minutes of decode at ~20 ms a step


@dataclass(frozen=True)
class PrefillChunk:
    start: int  # position of the chunk's first token (tokens before it were cached or computed earlier)
    tokens: int
    samples: bool = False  # the chunk ends its prompt: a token is sampled from its last row


@dataclass(frozen=True)
class StepRecord:
    index: int  # 0, 1, 2, ... since the engine started
    timestamp: float  # wall clock (time.time()) when the forward pass ended
    seconds: float  # the forward pass
    tokens: int  # rows computed: prefill tokens, one per decode row, plus any speculative guesses verified
    decode_contexts: tuple[int, ...]  # one per decode row: tokens already cached for that sequence
    prefill_chunks: tuple[PrefillChunk, ...]
    weight_bytes: float
    kv_bytes: float
    flops: float
    after_idle: bool = False  # the engine thread waited for work (or had just started) before this step
    # With an ITL target (SchedulerOutput.budget): the prefill tokens the step could take, the target in seconds
    # (None while the step-cost estimate learns), and the estimate's prediction for the step as scheduled (the
    # whole engine step, scheduling to sampled tokens, which is what it is fitted to; `seconds` is the forward pass).
    prefill_limit: int | None = None
    itl_target_s: float | None = None
    predicted_s: float | None = None
    # The calling thread's CPU time in the forward pass. Below `seconds` by what that thread waited: for the GIL
    # (the server's event loop runs between kernels, which release it) or for a core. With one thread it is the
    # pass's own work, so a step slower in `seconds` but not here was slowed by something beside it. (With more
    # threads the kernels' other threads are not counted.)
    cpu_seconds: float | None = None

    @property
    def verified_guesses(self) -> bool:
        """Whether a decode row of this step also verified speculative guesses (they count in `tokens` only)."""
        return self.tokens != self.decode_rows + self.prefill_tokens

    @property
    def chunks(self) -> tuple[tuple[int, int, bool], ...]:
        """(start, num_tokens, samples) per chunk, as the scheduler planned them (TermsOf.of_chunks). Only for
        steps without speculative guesses: a decode row that verifies guesses is kept as its context alone."""
        if self.verified_guesses:
            raise ValueError(f"step {self.index} verified speculative guesses: its chunks are not recorded")
        return (*((context, 1, True) for context in self.decode_contexts),
                *((chunk.start, chunk.tokens, chunk.samples) for chunk in self.prefill_chunks))

    @classmethod
    def from_json(cls, row: dict) -> "StepRecord":
        """The record back from its to_json() (what GET /v1/steps serves)."""
        return cls(row["index"], row["timestamp"], row["seconds"], row["tokens"], tuple(row["decode_contexts"]),
                   tuple(PrefillChunk(c["start"], c["tokens"], c["samples"]) for c in row["prefill_chunks"]),
                   row["weight_bytes"], row["kv_bytes"], row["flops"], row["after_idle"],
                   row.get("prefill_limit"), row.get("itl_target_s"), row.get("predicted_s"), row.get("cpu_seconds"))

    @property
    def decode_rows(self) -> int:
        return len(self.decode_contexts)

    @property
    def prefill_rows(self) -> int:
        return len(self.prefill_chunks)

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk.tokens for chunk in self.prefill_chunks)

    @property
    def nbytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte read or written (the roofline's x axis)."""
        return self.flops / self.nbytes

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s (the roofline's y axis)."""
        return self.flops / self.seconds if self.seconds > 0 else 0.0

    @property
    def kind(self) -> str:
        """'decode', 'prefill' or 'mixed' (decode rows riding along with a prefill chunk)."""
        if not self.prefill_chunks:
            return "decode"
        return "mixed" if self.decode_contexts else "prefill"

    def to_json(self) -> dict:
        contexts = self.decode_contexts
        return {
            "index": self.index,
            "timestamp": self.timestamp,
            "seconds": self.seconds,
            "kind": self.kind,
            "tokens": self.tokens,
            "decode_rows": self.decode_rows,
            "prefill_rows": self.prefill_rows,
            "prefill_tokens": self.prefill_tokens,
            "decode_context": {"min": min(contexts), "mean": sum(contexts) / len(contexts), "max": max(contexts)}
            if contexts else None,
            "decode_contexts": list(contexts),
            "prefill_chunks": [{"start": c.start, "tokens": c.tokens, "samples": c.samples}
                               for c in self.prefill_chunks],
            "after_idle": self.after_idle,
            "weight_bytes": self.weight_bytes,
            "kv_bytes": self.kv_bytes,
            "flops": self.flops,
            "intensity": self.intensity,
            "flops_per_s": self.flops_per_s,
            "prefill_limit": self.prefill_limit,
            "itl_target_s": self.itl_target_s,
            "predicted_s": self.predicted_s,
            "cpu_seconds": self.cpu_seconds,
        }


class StepRecorder:
    """Ring buffer of StepRecords for one engine (one model, one KV element size)."""

    def __init__(self, shape: ModelShape, kv_dtype_bytes: float, capacity: int = DEFAULT_CAPACITY):
        self.shape = shape
        self.kv_dtype_bytes = kv_dtype_bytes
        self._steps: deque[StepRecord] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._next_index = 0
        self._idle = True  # the first step follows the engine's start

    def idle(self) -> None:
        """The engine thread is about to wait for work: the next step does not follow the last back to back."""
        self._idle = True

    def record(self, plan: SchedulerOutput, seconds: float, cpu_seconds: float | None = None) -> StepRecord:
        """Cost one forward pass over `plan`'s chunks that took `seconds` (`cpu_seconds` of the calling thread's
        CPU time), and keep it."""
        shape, kv_dtype = self.shape, self.kv_dtype_bytes
        contexts = []
        prefills = []
        flops = kv_bytes = 0.0
        sampled_rows = 0  # rows the LM head computes: a decode row and its guesses, a chunk's last token if it samples
        for chunk in plan.chunks:
            start, end = chunk.start, chunk.start + chunk.num_tokens
            # Causal attention of rows start..end-1 (one row: exactly attention_flops_per_token(start)).
            flops += shape.prefill_attention_flops(end) - shape.prefill_attention_flops(start)
            if chunk.samples and chunk.num_tokens == 1 + len(chunk.draft_token_ids):
                # A decode row (with any speculative guesses riding along): reads its sequence's cached KV.
                contexts.append(start)
                kv_bytes += shape.kv_bytes_for_context(start, kv_dtype)
                sampled_rows += chunk.num_tokens
            else:
                prefills.append(PrefillChunk(start, chunk.num_tokens, chunk.samples))
                kv_bytes += shape.kv_bytes_for_context(end, kv_dtype)  # the prefix read, the chunk written
                sampled_rows += int(chunk.samples)
        tokens = plan.num_batched_tokens
        # (A request for prompt logprobs has logits computed at every prompt position: counted as one row here.)
        flops += shape.matmul_flops(tokens, sampled_rows)
        budget = plan.budget
        with self._lock:
            step = StepRecord(self._next_index, time.time(), seconds, tokens, tuple(contexts), tuple(prefills),
                              shape.weight_bytes_read(tokens), kv_bytes, flops, self._idle,
                              *((budget.prefill_limit, budget.target_s, budget.predicted_s) if budget else
                                (None, None, None)), cpu_seconds)
            self._idle = False
            self._next_index += 1
            self._steps.append(step)
        return step

    def keep(self, step: StepRecord) -> None:
        """Keep a record another recorder made (an engine core in its own process ships its steps to the API
        process's copy, which the dashboard reads): its index stays the one it was given."""
        with self._lock:
            self._steps.append(step)
            self._next_index = step.index + 1

    @property
    def num_recorded(self) -> int:
        return self._next_index

    def recent(self, after: int = -1, limit: int | None = None) -> list[StepRecord]:
        """Kept steps with index > `after`, oldest first; at most the `limit` newest of them."""
        with self._lock:
            steps = list(self._steps)
        if after >= 0:  # indices are consecutive, so the wanted ones are a tail
            steps = steps[len(steps) - min(len(steps), max(0, self._next_index - 1 - after)):]
        return steps[-limit:] if limit else steps
