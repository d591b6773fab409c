"""What crosses between the API process and its engine core, both ways: frozen dataclasses of plain data,
pickled (highest protocol) into one ZeroMQ frame each. Pickle, not a schema'd encoding, because the payloads
are the engine's own dataclasses (AdmittedRequest, RequestOutput, EngineStats, StepRecord...) and both ends are
the same code base on the same machine; the sockets are ipc:// paths in a private directory, never a network.
"""

import pickle
from dataclasses import dataclass

from ridgeline.dashboard.engine_view import EngineView
from ridgeline.engine.admission import AdmissionLimits
from ridgeline.engine.messages import AddRequest
from ridgeline.engine.outputs import EngineStats, RequestOutput
from ridgeline.engine.step_record import StepRecord
from ridgeline.napkin.model_shape import ModelShape

# ---------------------------------------------------------------- API process -> core


@dataclass(frozen=True)
class Submit:
    """Requests that passed admission in the API process (all the choices of one HTTP request)."""

    requests: tuple[AddRequest, ...]


@dataclass(frozen=True)
class Abort:
    """Stop these requests now and free their pages (client gone, deadline, shutdown); each still gets its final
    "abort" output."""

    request_ids: tuple[str, ...]


@dataclass(frozen=True)
class Shutdown:
    """Apply what came before, then stop the engine and exit."""


# ---------------------------------------------------------------- core -> API process


@dataclass(frozen=True)
class CoreReady:
    """The model is loaded: what the API process needs to admit, tokenise and describe without the engine."""

    pid: int
    model_name: str
    limits: AdmissionLimits  # the engine's admission limits (the API process runs the same check)
    vocab_size: int
    tokenizer: object  # the engine's tokenizer, so the API process tokenises exactly as the engine would
    capacity_report: str
    shape: ModelShape  # for the dashboard's roofline, with the KV element size
    kv_dtype_bytes: float
    view: EngineView
    stats: EngineStats  # the engine's counters before any request


@dataclass(frozen=True)
class StatsSnapshot:
    """The engine as one step left it: what /metrics, /health and the dashboard read in the API process."""

    stats: EngineStats
    num_held: int
    time: float  # time.monotonic() in the core (CLOCK_MONOTONIC: the same clock in every process here)
    steps: tuple[StepRecord, ...]  # step records made since the last snapshot
    view: EngineView | None  # a new dashboard view, when the core's feed took one


@dataclass(frozen=True)
class StepOutputs:
    """One step's outputs (or a request's failure: the exception it ended with), with the snapshot after it."""

    deliveries: tuple[tuple[str, RequestOutput | BaseException], ...]
    snapshot: StatsSnapshot | None


@dataclass(frozen=True)
class EngineDead:
    """The core's engine failed; the process exits after sending this."""

    reason: str


CoreMessage = Submit | Abort | Shutdown | CoreReady | StatsSnapshot | StepOutputs | EngineDead


def encode(message: CoreMessage) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(frame: bytes) -> CoreMessage:
    return pickle.loads(frame)
