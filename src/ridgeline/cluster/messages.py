"""Typed messages between the router and a worker (in-process, Ray actor): all plain picklable dataclasses.

Outputs travel as the engine's own `RequestOutput`, so a front can render them exactly as a colocated server does.
"""

from dataclasses import dataclass, field

from ridgeline.engine.admission import AdmissionLimits
from ridgeline.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker is, fixed for its life: the router learns it once when the worker joins."""

    worker_id: str
    model_name: str
    role: str  # "both" today; "prefill" / "decode" for disaggregated workers
    block_size: int  # tokens per KV block: the router hashes prompts in blocks of this size
    limits: AdmissionLimits  # what its engine admits: a front checks requests against these before sending
    num_kv_pages: int
    # Prompt blocks its prefix cache can hold: the pages over the layer groups (a prompt block takes a page in each
    # group, short of a sliding window). None: unknown, and the router charges nothing for evicting.
    cache_blocks: int | None = None

    @property
    def max_model_len(self) -> int:
        return self.limits.max_seq_len


@dataclass(frozen=True)
class CacheEvents:
    """Prefix-cache block hashes the worker gained and lost since its last report (see engine/prefix_cache.py);
    `cleared`: everything before `stored` is gone."""

    stored: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    cleared: bool = False


@dataclass(frozen=True)
class WorkerStatus:
    """A snapshot a worker reports; `received` counts the requests it had been sent when it was taken, so the
    router knows which of its own dispatches the reported backlog already covers."""

    worker_id: str
    alive: bool
    received: int
    num_running: int
    num_waiting: int
    queued_prefill_tokens: int  # prompt tokens received but not yet computed (the worker's real backlog)
    cache_events: CacheEvents = field(default_factory=CacheEvents)
    error: str | None = None
    # Per request in flight: prompt tokens it still has to prefill, cached prefix left out (None: not yet looked
    # at). The router sets its own count of each request to this; requests absent keep the router's count.
    prefill_remaining: dict[str, int | None] | None = None
    # KV pages, as the engine's last step left them: a worker whose requests all ended (or were aborted, their
    # clients gone) has every page free again (issue 38), what an operator of a Ray actor can only see here.
    num_free_pages: int | None = None
    num_total_pages: int | None = None
