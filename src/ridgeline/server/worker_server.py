"""A prefill or decode worker server started in-process on a given host: what each Ray actor of a worker pool runs
(cluster/ray_pool.py)."""

from ridgeline.cluster.ray_pool import PoolConfig


def start_worker_server(role: str, config: PoolConfig, host: str) -> str:
    """Load the model, serve it with `role` on a free port of `host` (KV on a free port too); returns the URL."""
    from ridgeline.engine.options import engine_config
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.server.app import ServerConfig, create_app
    from ridgeline.server.launcher import BackgroundServer, freeze_startup_heap

    engine = LLMEngine(engine_config(config.model, threads=config.threads_per_worker,
                                     kv_cache_memory=config.kv_cache_memory_for(role), kv_cache_dtype=config.kv_cache_dtype))
    engine.populate_kv_in_background()
    server = BackgroundServer(create_app(engine, ServerConfig(host=host, role=role, kv_bind=f"tcp://{host}:*",
                                                              max_kv_waiting=config.handoff.max_kv_waiting,
                                                              kv_lease_seconds=config.handoff.kv_lease_seconds)),
                              host=host)
    freeze_startup_heap()
    server.__enter__()  # serves until the process (the actor) ends
    return server.url
