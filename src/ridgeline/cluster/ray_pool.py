"""Pools of prefill and decode workers as Ray actors: Ray places them on the cluster's nodes and restarts one that
dies; the pool hands the front the workers' current URLs and looks again when one stops answering.

Each actor runs a whole worker server (`serve --role prefill|decode` in process: engine thread, HTTP, KV
endpoint; built by the function the caller passes, server/worker_server.py) bound to its node's address, so KV pages travel worker to worker over our own transport, never through Ray's object
store (a page pull is one ZeroMQ round trip; Ray only manages the processes). Ray is imported here alone: nothing
else in ridgeline needs it.
"""

import time
from dataclasses import dataclass, field

import httpx

from ridgeline.cluster.handoff import HandoffConfig

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class PoolConfig:
    model: str | None = None  # GGUF file or HF directory, as every node sees it; None: the bundled default model
    prefill_workers: int = 1
    decode_workers: int = 1
    cpus_per_worker: float = 1.0
    threads_per_worker: int = 1
    kv_cache_memory: str = "1GiB"
    # The decode workers' own KV budget (None: kv_cache_memory). A decode worker holds every running request's pages
    # for its whole output while a prefill worker holds a prompt's only until it is pulled, so the two are sized
    # apart -- and a small decode budget is how its backpressure (429/503 before a prefill) is exercised.
    decode_kv_cache_memory: str | None = None
    kv_cache_dtype: str = "bf16"
    max_restarts: int = -1  # Ray restarts a dead worker this many times (-1: always)
    # The deployment's hand-off settings: each decode worker's KV queue bound and each prefill worker's lease come
    # from here, the front's part (re-prefills, hand-off wait) from the same value (FrontConfig.of).
    handoff: HandoffConfig = field(default_factory=HandoffConfig)

    def kv_cache_memory_for(self, role: str) -> str:
        """The KV budget of one worker of `role`."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        return self.decode_kv_cache_memory if role == "decode" and self.decode_kv_cache_memory else self.kv_cache_memory


def _worker_actor_class():
    import ray

    @ray.remote
    class WorkerActor:
        """One worker inside a Ray actor: `start(role, config, node_host) -> url` builds and serves it (the caller's
        function, so this layer knows nothing of what a worker serves); its URL changes when Ray restarts it."""

        def __init__(self, start, role: str, config: PoolConfig):
            import ray as ray_in_actor

            self._url = start(role, config, ray_in_actor.util.get_node_ip_address())

        def url(self) -> str:
            return self._url

    return WorkerActor


class RayWorkerPool:
    """`pool.urls("prefill")`: the URLs of the live workers of a role; `pool.refresh()` after a worker failed.
    `start(role, config, host) -> url` runs inside each actor and serves the worker (server/worker_server.py)."""

    def __init__(self, config: PoolConfig, start, address: str | None = None, start_timeout: float = 300.0):
        import ray

        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        actor = _worker_actor_class().options(num_cpus=config.cpus_per_worker, max_restarts=config.max_restarts,
                                              max_task_retries=-1)
        self.actors = {"prefill": [actor.remote(start, "prefill", config) for _ in range(config.prefill_workers)],
                       "decode": [actor.remote(start, "decode", config) for _ in range(config.decode_workers)]}
        self.start_timeout = start_timeout
        self._urls: dict[str, list[str]] = {}
        self.refresh()

    def refresh(self) -> None:
        """Ask every actor for its URL (waiting while Ray restarts one) and keep those that answer /health."""
        import ray

        deadline = time.monotonic() + self.start_timeout
        for role, actors in self.actors.items():
            urls = [self._live_url(actor, deadline) for actor in actors]
            self._urls[role] = [url for url in urls if url is not None]

    @staticmethod
    def _live_url(actor, deadline: float) -> str | None:
        """The actor's URL once it answers /health; None if it does not by the deadline (Ray may be restarting it:
        calls to a restarting actor fail until it is back)."""
        import ray

        while time.monotonic() < deadline:
            try:
                url = ray.get(actor.url.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(0.2)
                continue
            if _healthy(url, min(deadline, time.monotonic() + 10)):
                return url
        return None

    def urls(self, role: str) -> list[str]:
        return list(self._urls[role])

    def shutdown(self) -> None:
        import ray

        for actors in self.actors.values():
            for actor in actors:
                ray.kill(actor, no_restart=True)


def _healthy(url: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False
