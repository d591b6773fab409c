"""Typed messages into an engine core: what a front end (the server's event loop today; a router or a
disaggregated worker's peer tomorrow) sends to the thread or process that owns the engine.

Plain frozen dataclasses of plain data, so they cross a thread queue as they are and a process boundary
pickled, with no engine object inside.
"""

from dataclasses import dataclass

from ridgeline.engine.admission import AdmittedRequest


@dataclass(frozen=True)
class AddRequest:
    """Queue a request that already passed admission (engine/admission.py)."""

    request_id: str
    request: AdmittedRequest
    arrival_time: float  # time.monotonic() when it reached the front end: queue time counts from here
    fork_of: str | None = None  # a request with the same prompt whose prefilled pages this one shares (n > 1)


@dataclass(frozen=True)
class AbortRequest:
    """Stop a request now and free its KV pages (client gone, error, shutdown)."""

    request_id: str


EngineMessage = AddRequest | AbortRequest
