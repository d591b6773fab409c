"""What the engine hands back after each step, and the numbers it reports about itself."""

from dataclasses import dataclass, field

from ridgeline.engine.sampler import TokenLogprobs


@dataclass
class RequestTimings:
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies: gaps between consecutive output tokens."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # all so far
    new_token_ids: list[int]  # produced by this step
    text: str  # all so far (stop strings trimmed)
    new_text: str  # what a stream should send now
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    logprobs: list[TokenLogprobs] | None
    prompt_logprobs: list[TokenLogprobs] | None  # for prompt tokens 1..P-1 (the first has no context)
    num_cached_tokens: int
    timings: RequestTimings


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    # KV pages (a page = one block of tokens for one layer group's layers); evictable cached pages count as free
    num_free_pages: int
    num_total_pages: int
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int  # of which found cached
    num_preemptions: int
    num_prefilled_tokens: int = 0  # prompt tokens computed so far (prefix-cache hits and forks skip theirs)
    # Speculative decoding: guessed tokens verified, how many the model agreed with, and in how many verifications.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_verifications: int = 0
    # Structured outputs (engine/structured): requests that carried a constraint, grammars compiled (cache misses),
    # compiled ones found cached, constraints refused, and the time spent compiling and computing masks; the
    # masks' time is hidden behind the forward pass but for `grammar_mask_wait_seconds`, what steps waited.
    num_constrained_requests: int = 0
    grammars_compiled: int = 0
    grammar_cache_hits: int = 0
    grammars_refused: int = 0
    grammar_compile_seconds: float = 0.0
    grammar_masks: int = 0  # on the mask worker, beside the forward pass
    grammar_mask_seconds: float = 0.0
    grammar_mask_wait_seconds: float = 0.0
    grammar_masks_at_sampling: int = 0  # computed when the row was sampled: a refused check (engine/sampler.py)
    grammar_mask_at_sampling_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_verification(self) -> float:
        """Mean tokens a verifying decode step produced (accepted guesses + the one it always produces)."""
        return 1 + self.num_accepted_tokens / self.num_verifications if self.num_verifications else 1.0

    @property
    def kv_cache_usage(self) -> float:
        return 1 - self.num_free_pages / self.num_total_pages

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
