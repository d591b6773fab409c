"""Typed messages into an engine core: what a front end (the server's event loop, a router's worker, a
disaggregated worker's peer) sends to the thread that owns the engine (engine/engine_thread.py).

Plain frozen dataclasses of plain data, so they cross a thread queue as they are and a process boundary
pickled, with no engine object inside.
"""

from dataclasses import dataclass

from ridgeline.engine.admission import AdmittedRequest
from ridgeline.engine.kv_handoff import KVManifest
from ridgeline.engine.sampler import TokenLogprobs


@dataclass(frozen=True)
class AddRequest:
    """Queue a request that already passed admission (engine/admission.py)."""

    request_id: str
    request: AdmittedRequest
    arrival_time: float  # time.monotonic() when it reached the front end: queue time counts from here
    fork_of: str | None = None  # a request with the same prompt whose prefilled pages this one shares (n > 1)
    hold_kv: bool = False  # a prefill worker's request: keep its pages once finished, for a decode worker to pull


@dataclass(frozen=True)
class AbortRequest:
    """Stop a request now and free its KV pages (client gone, error, shutdown)."""

    request_id: str


@dataclass(frozen=True)
class ReceiveKV:
    """A decode worker's request: its prompt was prefilled (and its first token sampled) by a prefill worker at
    `source_address`, whose pages the manifest names; fetch what the prefix cache lacks, then decode."""

    request_id: str
    request: AdmittedRequest
    manifest: KVManifest
    source_address: str
    arrival_time: float
    first_logprobs: TokenLogprobs | None = None
    lease_seconds: float | None = None  # how long the prefill worker holds the pages unasked (None: its default)


EngineMessage = AddRequest | AbortRequest | ReceiveKV
