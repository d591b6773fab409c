"""What a disaggregated deployment promises a request between its prefill and its decode (issue 41), set once and
handed to every part that keeps the promise: the front (`ridgeline proxy`, or the one `ridgeline serve
--prefill-workers N --decode-workers M` runs over its Ray pools) and the workers it builds.

A plain value (no server, no Ray): the CLI builds it from its options (cli/disaggregation_options.py), the Ray pool
carries it into each worker actor (cluster/ray_pool.py, server/worker_server.py), and the front reads its part
(server/disaggregated_front.py: FrontConfig.of).
"""

from dataclasses import dataclass

LOCAL_PREFILL_TOKENS = 64
MAX_REPREFILLS = 2
HANDOFF_WAIT_SECONDS = 30.0
MAX_KV_WAITING = 64
KV_LEASE_SECONDS = 30.0


@dataclass(frozen=True)
class HandoffConfig:
    # The front's side.
    local_prefill_tokens: int = LOCAL_PREFILL_TOKENS  # prompts whose uncached part is shorter: prefilled on decode
    max_reprefills: int = MAX_REPREFILLS  # prefills again of a request whose held pages were gone, before a 503
    handoff_wait: float = HANDOFF_WAIT_SECONDS  # a prefilled request waits this long for a full decode worker
    # The workers' side.
    max_kv_waiting: int = MAX_KV_WAITING  # a decode worker's requests waiting for KV room, beyond which it refuses
    kv_lease_seconds: float = KV_LEASE_SECONDS  # a prefill worker frees pages nobody kept alive for this long

    def __post_init__(self) -> None:
        if self.local_prefill_tokens < 0 or self.max_reprefills < 0 or self.handoff_wait < 0:
            raise ValueError(f"negative setting in {self}")
        if self.max_kv_waiting < 1 or self.kv_lease_seconds <= 0:
            raise ValueError(f"max_kv_waiting must be >= 1 and kv_lease_seconds > 0 in {self}")
