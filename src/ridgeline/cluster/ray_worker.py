"""The worker as a Ray actor: the same EngineWorker (worker.py), its engine built inside the actor's process.

Ray is imported only here and only when a Ray backend is configured (`ensure_ray`), so nothing else needs it.
The actor's methods mirror the worker API: `info()`, `status()`, `generate(request)` (a Ray streaming generator
of RequestOutputs: call it with `.options(num_returns="streaming")`), `abort(request_id)`, `kill(reason)`. It is
a threaded actor, so many `generate` calls block on their own queues while one `status` call still answers.
Disaggregated roles (#12) start the same actor with role="prefill" or "decode".
"""

import os
import queue

from ridgeline.cluster.messages import GenerateRequest, WorkerInfo, WorkerStatus
from ridgeline.errors import RidgelineError

ACTOR_CONCURRENCY = 64  # generate calls in flight per actor (each holds one of its threads while it streams)


def ray_module():
    try:
        import ray
    except ImportError:
        raise RidgelineError("a Ray backend needs Ray: pip install 'ridgeline[cluster]'") from None
    return ray


def ensure_ray(address: str | None = None, num_cpus: int | None = 2):
    """Join the Ray cluster at `address`, or start a small local one (no dashboard), once per process."""
    ray = ray_module()
    if not ray.is_initialized():
        options = {"address": address} if address else {"num_cpus": num_cpus}
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **options)
    return ray


class WorkerActor:
    def __init__(self, engine_config, worker_id: str, role: str = "both"):
        from ridgeline.cluster.worker import EngineWorker
        from ridgeline.engine.llm_engine import LLMEngine

        self.worker = EngineWorker(LLMEngine(engine_config), worker_id, role).start()

    def info(self) -> WorkerInfo:
        return self.worker.info

    def status(self) -> WorkerStatus:
        return self.worker.status()

    def pid(self) -> int:
        return os.getpid()

    def generate(self, request: GenerateRequest):
        outputs: queue.Queue = queue.Queue()
        self.worker.submit(request, outputs.put)
        finished = False
        try:
            while not finished:
                item = outputs.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.worker.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        self.worker.abort(request_id)

    def kill(self, reason: str = "killed") -> None:
        self.worker.kill(reason)


def start_worker_actor(engine_config, worker_id: str, role: str = "both", num_cpus: float = 1.0):
    """A WorkerActor on the Ray cluster (ensure_ray first). Returns its handle; its engine loads asynchronously."""
    ray = ray_module()
    actor_class = ray.remote(num_cpus=num_cpus, max_concurrency=ACTOR_CONCURRENCY)(WorkerActor)
    return actor_class.options(name=None).remote(engine_config, worker_id, role)
