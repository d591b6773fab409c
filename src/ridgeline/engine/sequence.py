"""One request's token stream and the state the scheduler keeps for it (no model code, no tensors)."""

import enum
from typing import TYPE_CHECKING
from dataclasses import dataclass, field

from ridgeline.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from ridgeline.engine.structured.matcher import GrammarMatcher


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, never admitted
    RUNNING = "running"  # admitted: holds KV pages, gets prefill chunks or decodes
    PREEMPTED = "preempted"  # pages taken back; queued again to be recomputed
    FINISHED = "finished"


@dataclass(eq=False)  # identity equality: two requests with equal tokens are still two requests
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    # Tokens whose KV is in the cache. Reset to 0 on preemption: the generated tokens are then recomputed
    # as if they were part of the prompt.
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at first admission (tokens whose prefill was skipped)
    # One block table per layer group (model/kv_groups.py) while it holds pages, [] otherwise. Entry i of table g
    # is the page holding block i (tokens [i*bs, (i+1)*bs)) for group g's layers, or RELEASED (-1) once no later
    # query of a sliding-window group can read it. Plain ints, so pages can move.
    block_tables: list[list[int]] = field(default_factory=list)
    # Chained hash of each full block of token_ids (block i covers tokens [i*bs, (i+1)*bs)). Depends on the
    # tokens only, so it stays valid across preemption; grown lazily by the block manager.
    block_hashes: list[bytes] = field(default_factory=list)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each output token was appended
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    # Keep the pages once finished, until a KV transfer collects them (a prefill worker's requests).
    hold_kv: bool = False
    # The request's grammar state (engine/structured/matcher.py), when it asked for structured output.
    grammar: "GrammarMatcher | None" = None
    # Priority levels gained by waiting (SchedulerConfig.priority_aging_steps): the bound on starvation.
    aged: int = 0

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        # Prompt then output, kept as one list so chunks and block hashes can slice it without copying both.
        self.token_ids: list[int] = self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def priority(self) -> int:
        """Lower is served first: SamplingParams.priority, less what the request gained by waiting."""
        return self.sampling_params.priority - self.aged

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now
