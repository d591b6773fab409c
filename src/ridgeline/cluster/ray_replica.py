"""A worker in a Ray actor (ray_worker.py) behind the replica interface: outputs stream back through a Ray
streaming generator, and an actor that died turns into ReplicaFailed for every request it held."""

import asyncio
from collections.abc import AsyncIterator

from ridgeline.cluster.errors import ReplicaError, ReplicaFailed
from ridgeline.cluster.messages import GenerateRequest, WorkerStatus
from ridgeline.cluster.ray_worker import ray_module, start_worker_actor
from ridgeline.cluster.replicas import WorkerReplica
from ridgeline.engine.outputs import RequestOutput


def _as_replica_error(error: BaseException, name: str) -> ReplicaError:
    cause = getattr(error, "cause", None)  # RayTaskError carries the actor's own exception
    if isinstance(cause, ReplicaError):
        return cause
    return ReplicaFailed(f"{name}: Ray actor failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


class RayReplica(WorkerReplica):
    kind = "ray"

    def __init__(self, name: str, model: str, engine_config, num_cpus: float = 1.0, probe_timeout_s: float = 5.0):
        super().__init__(name, model)
        self.engine_config = engine_config
        self.num_cpus = num_cpus
        self.probe_timeout_s = probe_timeout_s
        self.actor = start_worker_actor(engine_config, name, num_cpus=num_cpus)
        self.info = None

    async def ready(self) -> None:
        """Wait for the actor's engine to load (its first method call answers once __init__ is done)."""
        self.info = await self.actor.info.remote()

    async def probe(self) -> WorkerStatus:
        ray = ray_module()
        try:
            status = await asyncio.wait_for(self.actor.status.remote(), self.probe_timeout_s)
        except asyncio.TimeoutError:
            raise ReplicaFailed(f"{self.name}: no status within {self.probe_timeout_s}s") from None
        except ray.exceptions.RayError as error:
            raise _as_replica_error(error, self.name) from None
        if not status.alive:
            raise ReplicaFailed(f"{self.name}: {status.error or 'stopped'}")
        return status

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        ray = ray_module()
        stream = self.actor.generate.options(num_returns="streaming").remote(request)
        finished = False
        try:
            while not finished:
                try:
                    ref = await stream.__anext__()
                    output = await ref
                except StopAsyncIteration:
                    raise ReplicaFailed(f"{self.name}: stream ended before the request finished") from None
                except ray.exceptions.RayError as error:
                    finished = True
                    raise _as_replica_error(error, self.name) from None
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.actor.abort.remote(request.request_id)

    def kill(self) -> None:
        """Kill the actor's process (tests): Ray reports it dead to every caller."""
        ray_module().kill(self.actor, no_restart=True)

    def restart(self) -> None:
        self.actor = start_worker_actor(self.engine_config, self.name, num_cpus=self.num_cpus)

    async def close(self) -> None:
        try:
            ray_module().kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
