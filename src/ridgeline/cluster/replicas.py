"""What the router needs of a replica, whatever runs it: in this process, in a Ray actor, or behind HTTP.

A ridgeline worker replica (local_replica.py, ray_replica.py) takes token ids and streams the engine's own
RequestOutputs; an OpenAI-compatible server (http_replica.py) takes the request body as the client sent it.
`generate` raises ReplicaUnavailable when the replica refused the request before any work (the router then
tries another), ReplicaFailed when it broke with the request in flight, ReplicaRejected when the request is
at fault.
"""

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from ridgeline.cluster.messages import GenerateRequest, WorkerInfo, WorkerStatus
from ridgeline.engine.outputs import RequestOutput


class Replica(ABC):
    kind: str = ""

    def __init__(self, name: str, model: str):
        self.name = name  # unique across the router, e.g. "gemma/0"
        self.model = model  # the model name clients use

    @abstractmethod
    async def probe(self) -> WorkerStatus | None:
        """Health check: a status snapshot (None where the replica reports none); raises ReplicaError if unhealthy."""

    async def close(self) -> None:
        """Release what the replica holds (threads, actors, connections)."""


class WorkerReplica(Replica):
    info: WorkerInfo

    @abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """The request's outputs as the engine produces them; leaving early aborts it on the worker."""
