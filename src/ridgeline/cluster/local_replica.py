"""A worker in this process: an EngineWorker (its own engine thread) behind the replica interface."""

import asyncio
from collections.abc import AsyncIterator, Callable

from ridgeline.cluster.errors import ReplicaFailed
from ridgeline.cluster.messages import GenerateRequest, WorkerStatus
from ridgeline.cluster.replicas import WorkerReplica
from ridgeline.cluster.worker import EngineWorker
from ridgeline.engine.outputs import RequestOutput


class LocalReplica(WorkerReplica):
    kind = "engine"

    def __init__(self, name: str, model: str, make_engine: Callable[[], object]):
        super().__init__(name, model)
        self._make_engine = make_engine
        self.worker = EngineWorker(make_engine(), name).start()
        self.info = self.worker.info

    @property
    def tokenizer(self):
        return self.worker.engine.tokenizer

    @property
    def admission(self):
        return self.worker.engine.admission

    async def probe(self) -> WorkerStatus:
        status = self.worker.status()
        if not status.alive:
            raise ReplicaFailed(f"{self.name}: {status.error or 'stopped'}")
        return status

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        worker = self.worker  # a restart replaces it; this request stays with the one it was sent to

        def sink(item) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        worker.submit(request, sink)
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True  # the worker has already dropped it
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                worker.abort(request.request_id)

    def kill(self, reason: str = "killed") -> None:
        """Simulate the worker dying (tests, benchmarks): its requests in flight fail, new ones are refused."""
        self.worker.kill(reason)

    def restart(self) -> None:
        """A fresh engine in place of a dead one; it rejoins when the next health check passes."""
        self.worker.stop()
        self.worker = EngineWorker(self._make_engine(), self.name).start()
        self.info = self.worker.info

    async def close(self) -> None:
        await asyncio.to_thread(self.worker.stop)
