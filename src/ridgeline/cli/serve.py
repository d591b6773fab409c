"""`ridgeline serve`: the OpenAI-compatible HTTP server over one model."""

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from ridgeline.cli.app import app
from ridgeline.cli.disaggregation_options import (HANDOFF_WAIT, LOCAL_PREFILL_TOKENS, MAX_KV_WAITING, MAX_REPREFILLS,
                                                 handoff_config)
from ridgeline.cli.tenant_options import TENANTS, USAGE_DB
from ridgeline.cli.engine_options import ITL_TARGET_MS, KV_CACHE_DTYPE, KV_CACHE_DTYPE_K, KV_CACHE_DTYPE_V

if TYPE_CHECKING:
    from ridgeline.cluster.handoff import HandoffConfig


@app.command("serve", help="Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, metrics).")
def serve_command(
    model: Path = typer.Argument(None, help="GGUF file or Hugging Face directory (default: the bundled model)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; the default keeps the server on loopback."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    api_key: str = typer.Option(None, "--api-key", envvar="RIDGELINE_API_KEY", help="Require 'Authorization: Bearer KEY'."),
    tenants: Path = TENANTS,
    usage_db: Path = USAGE_DB,
    served_model_name: str = typer.Option(None, "--served-model-name", help="Model name clients use (default: the file's name)."),
    max_num_seqs: int = typer.Option(256, "--max-num-seqs", min=1, help="Sequences in the running batch at most."),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens", min=1, help="Tokens computed per step (all of them prefill when no decode runs; see --itl-target-ms)."),
    itl_target_ms: str = ITL_TARGET_MS,
    priority_aging_steps: int = typer.Option(None, "--priority-aging-steps", min=1, help="Ageing: every this many engine steps, each waiting request goes one priority level earlier, so a low priority (a batch tenant) is admitted at last under sustained higher-priority load (default: strict priority)."),
    kv_cache_memory: str = typer.Option("2GiB", "--kv-cache-memory", help="KV-cache budget, e.g. 2GiB or 512MiB (with Ray workers: each worker's, unless --decode-kv-cache-memory sets the decode workers')."),
    decode_kv_cache_memory: str = typer.Option(None, "--decode-kv-cache-memory", help="Disaggregated on Ray: each decode worker's KV-cache budget, e.g. 8GiB (default: --kv-cache-memory). A decode worker keeps every running request's pages to its last token, a prefill worker a prompt's only until it is pulled, so the decode side usually wants more."),
    kv_cache_dtype: str = KV_CACHE_DTYPE,
    kv_cache_dtype_k: str = KV_CACHE_DTYPE_K,
    kv_cache_dtype_v: str = KV_CACHE_DTYPE_V,
    block_size: int = typer.Option(16, "--block-size", min=1, help="Tokens per KV-cache block."),
    max_model_len: int = typer.Option(None, "--max-model-len", min=2, help="Most tokens (prompt + output) one request may reach; a request without max_tokens stops there (default: the model's context, or what the KV cache holds)."),
    no_prefix_caching: bool = typer.Option(False, "--no-prefix-caching", help="Do not reuse KV blocks of shared prompt prefixes."),
    dtype: str = typer.Option("float32", "--dtype", help="Activation dtype: float32 or bfloat16."),
    lm_head: str = typer.Option("keep", "--lm-head", help="keep the LM head as stored, or requantise it to q8 (Q8_0) or q4 (Q4_0): fewer bytes per decoded token at some accuracy (docs/models.md has the measured trade)."),
    threads: int = typer.Option(None, "--threads", min=1, help="Torch intra-op threads (default: torch's choice)."),
    max_waiting: int = typer.Option(256, "--max-waiting", min=0, help="Requests queued beyond the batch before 503s."),
    max_body_kib: int = typer.Option(4096, "--max-body-kib", min=1, help="Largest request body accepted, in KiB (else 413)."),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", min=0, help="Seconds in-flight requests get on SIGTERM."),
    log_prompts: bool = typer.Option(False, "--log-prompts", help="Put prompt text in the request log (off: ids and counts only)."),
    speculative_tokens: int = typer.Option(0, "--speculative-tokens", min=0, help="Speculative decoding: guess up to this many next tokens per greedy request from n-grams already in its text, and verify them in the same step (0: off)."),
    role: str = typer.Option("both", "--role", help="both: prefill and decode here (colocated). prefill / decode: one side of disaggregated serving behind `ridgeline proxy`; a prefill worker keeps each prompt's KV pages for a decode worker to pull."),
    kv_bind: str = typer.Option("tcp://127.0.0.1:*", "--kv-bind", help="A prefill worker's KV endpoint, e.g. tcp://0.0.0.0:5557 (* = any free port)."),
    kv_host: str = typer.Option(None, "--kv-host", help="The host decode workers dial for this prefill worker's KV (default: as bound)."),
    max_kv_waiting: int = MAX_KV_WAITING,
    kv_link_rate: float = typer.Option(None, "--kv-link-rate", min=1, help="A prefill worker sends its KV pages at most this many bytes/s, page by page: emulates a slower link than the real one (benchmarks, fault tests)."),
    prefill_workers: int = typer.Option(0, "--prefill-workers", min=0, help="Disaggregated on Ray: this many prefill workers as Ray actors (with --decode-workers), behind one endpoint here."),
    decode_workers: int = typer.Option(0, "--decode-workers", min=0, help="Disaggregated on Ray: this many decode workers as Ray actors."),
    ray_address: str = typer.Option(None, "--ray-address", help="The Ray cluster for --prefill-workers/--decode-workers (default: start a local one)."),
    local_prefill_tokens: int = LOCAL_PREFILL_TOKENS,
    handoff_wait: float = HANDOFF_WAIT,
    max_reprefills: int = MAX_REPREFILLS,
    router: Path = typer.Option(None, "--router", help="Serve the models and replicas of this router config (TOML) instead of MODEL, with `auto` routing."),
    memory: str = typer.Option(None, "--memory", help="With --router: memory budget, e.g. 16GB; load only the tiers that fit."),
    usd_per_hour: float = typer.Option(None, "--usd-per-hour", min=0, help="This machine's price, US dollars an hour: /metrics and the dashboard show its live $ per million tokens at it."),
    engine_core: str = typer.Option("thread", "--engine-core", help="thread: the engine steps on a thread of the server's process. process: in a process of its own, driven over ZeroMQ, so tokenising, templating and HTTP never hold its GIL (docs/engine_core.md); a killed core fails its requests with 503 and is restarted. Not with --role prefill/decode, Ray workers or --router."),
    api_server_count: int = typer.Option(1, "--api-server-count", min=1, help="With --engine-core process: this many API-server processes (HTTP, tokenising, chat templates, streaming) on one port (SO_REUSEPORT), all driving the one engine core; each answers with an X-Ridgeline-Api-Server header, and each one's /metrics reports the whole server (counters and histograms summed over the processes, the core's gauges once; docs/engine_core.md)."),
    hardware: str = typer.Option("this-machine", "--hardware", help="Machine the /dashboard roofline is drawn for: a catalogue name, or this-machine (as `ridgeline measure` cached it, else a napkin estimate labelled NOT MEASURED; never measured here)."),
) -> None:
    _check_engine_core(engine_core, role, router, prefill_workers or decode_workers, usd_per_hour, api_server_count)
    if decode_kv_cache_memory is not None and not (prefill_workers or decode_workers):
        from ridgeline.errors import RidgelineError

        # A `--role decode` server is one decode worker: its budget is --kv-cache-memory.
        raise RidgelineError("--decode-kv-cache-memory sizes Ray decode workers (--prefill-workers/--decode-workers); "
                             "a --role decode server takes --kv-cache-memory")
    if tenants is not None:
        from ridgeline.tenancy.config import load_tenants

        load_tenants(tenants)  # a bad file is one line before the model loads, not after
    if router is not None:
        from ridgeline.cli.router import run_router

        run_router(router, memory, host, port, api_key, tenants=tenants, usage_db=usage_db, drain_timeout=drain_timeout)
        return
    if prefill_workers or decode_workers:
        if kv_cache_dtype_k or kv_cache_dtype_v:  # the Ray workers' config carries one KV type for both sides
            from ridgeline.errors import RidgelineError

            raise RidgelineError("Ray workers take one KV type for K and V: use --kv-cache-dtype")
        _serve_on_ray(model, host, port, prefill_workers, decode_workers, ray_address, threads, kv_cache_memory,
                      kv_cache_dtype, handoff_config(local_prefill_tokens, max_reprefills, handoff_wait, max_kv_waiting),
                      decode_kv_cache_memory)
        return
    from ridgeline.engine.options import engine_config, parse_itl_target
    from ridgeline.dashboard.machine import roof_note
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.server.app import ServerConfig, create_app
    from ridgeline import startup_clock
    from ridgeline.server.launcher import configure_logging, run_server

    configure_logging()
    config = engine_config(
        model,
        threads=threads,
        dtype=dtype,
        lm_head=lm_head,
        kv_cache_memory=kv_cache_memory,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_dtype_k=kv_cache_dtype_k,
        kv_cache_dtype_v=kv_cache_dtype_v,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        prefix_caching=not no_prefix_caching,
        max_model_len=max_model_len,
        speculative_tokens=speculative_tokens,
        itl_target=parse_itl_target(itl_target_ms),
        priority_aging_steps=priority_aging_steps,
    )
    server_config = ServerConfig(
        host=host,
        port=port,
        api_key=api_key,
        tenants_file=str(tenants) if tenants else None,
        usage_db=str(usage_db) if usage_db else None,
        served_model_name=served_model_name,
        max_waiting=max_waiting,
        max_body_bytes=max_body_kib * 1024,
        drain_timeout=drain_timeout,
        log_prompts=log_prompts,
        role=role,
        kv_bind=kv_bind,
        kv_advertise_host=kv_host,
        kv_link_bytes_per_second=kv_link_rate,
        max_kv_waiting=max_kv_waiting,
        hardware=hardware,
        usd_per_hour=usd_per_hour,
    )
    console = Console(stderr=True)
    if api_server_count > 1:
        from ridgeline.server.engine_core.api_servers import ApiServers

        console.print(f"{api_server_count} API processes in front of one engine core; API process 0 logs the "
                      "core's pid and capacity once its model is loaded", highlight=False)
        raise typer.Exit(ApiServers(config, server_config, api_server_count).run())
    if engine_core == "process":
        from ridgeline.server.engine_core.process import CoreProcess

        engine = CoreProcess(config)
        with console.status("loading model in the engine core's process"):
            ready = engine.start()  # the core faults its KV pool in itself, once loaded
        console.print(f"engine core: process {ready.pid}", highlight=False)
    else:
        with console.status("loading model"):
            engine = LLMEngine(config)
        engine.populate_kv_in_background()  # the pool's pages faulted in while cores idle, not in the first steps
    console.print(engine.capacity_report, highlight=False)
    target = config.scheduler.itl_target
    console.print(f"step budget: {config.scheduler.max_num_batched_tokens} tokens; "
                  + (f"{target.describe()} caps prefill beside decodes" if target else "no ITL target"), highlight=False)
    # Read from the cache only, with the engine's thread count: never measured here (machine/this_machine.py).
    console.print(f"dashboard: http://{host}:{port}/dashboard ({roof_note(hardware)})", highlight=False, soft_wrap=True)
    app = create_app(engine, server_config)
    console.print(startup_clock.describe(startup_clock.process_seconds()), highlight=False, soft_wrap=True)
    run_server(app, server_config)


ENGINE_CORES = ("thread", "process")


def _check_engine_core(engine_core: str, role: str, router: Path | None, ray_workers: int,
                       usd_per_hour: float | None = None, api_server_count: int = 1) -> None:
    """--engine-core process runs the one-model colocated server; what reads the engine from the server's own
    process (a prefill worker's KV source, a decode worker's KV intake) or runs engines elsewhere is refused here,
    before anything loads."""
    from ridgeline.errors import RidgelineError

    if engine_core not in ENGINE_CORES:
        raise RidgelineError(f"--engine-core must be one of {', '.join(ENGINE_CORES)}, got {engine_core!r}")
    if engine_core == "thread":
        if api_server_count > 1:  # one engine thread per process: several API processes need a core to share
            raise RidgelineError("--api-server-count above 1 needs --engine-core process (the API processes share "
                                 "one engine core)")
        return
    if role != "both":
        raise RidgelineError(f"--engine-core process serves --role both only, not --role {role} (the KV hand-off "
                             "reads the engine's pages from the server's process)")
    if router is not None:
        raise RidgelineError("--engine-core process is not supported with --router (its workers run their own engines)")
    if ray_workers:
        raise RidgelineError("--engine-core process is not supported with --prefill-workers/--decode-workers (Ray)")
    if usd_per_hour is not None:
        raise RidgelineError("--usd-per-hour needs --engine-core thread (the live $/Mtok reads the engine's step "
                             "records, which stay in the core's process)")


def _serve_on_ray(model: Path | None, host: str, port: int, prefill_workers: int, decode_workers: int,
                  ray_address: str | None, threads: int | None, kv_cache_memory: str, kv_cache_dtype: str,
                  settings: "HandoffConfig", decode_kv_cache_memory: str | None = None) -> None:
    """Pools of prefill and decode workers placed and restarted by Ray, and the disaggregated front here; both read
    the hand-off settings from `settings` (the front its re-prefills and hand-off wait, each decode worker its KV
    queue bound), so the guarantees of `ridgeline proxy` over `serve --role` hold here as they are set there."""
    import uvicorn

    from ridgeline.errors import RidgelineError

    if not (prefill_workers and decode_workers):
        raise RidgelineError("disaggregated serving on Ray needs --prefill-workers and --decode-workers both >= 1")
    from ridgeline.engine.options import parse_bytes

    for size in (kv_cache_memory, decode_kv_cache_memory):  # a bad size is one line here, not an actor's traceback
        if size is not None:
            parse_bytes(size)
    try:
        from ridgeline.cluster.ray_pool import PoolConfig, RayWorkerPool
    except ImportError as error:
        raise RidgelineError(f"Ray workers need ray installed (pip install 'ridgeline[cluster]'): {error}") from None
    from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
    from ridgeline.server.launcher import configure_logging
    from ridgeline.server.worker_server import start_worker_server

    configure_logging()
    config = PoolConfig(model=None if model is None else str(model.resolve()), prefill_workers=prefill_workers,
                        decode_workers=decode_workers, threads_per_worker=threads or 1,
                        kv_cache_memory=kv_cache_memory, decode_kv_cache_memory=decode_kv_cache_memory,
                        kv_cache_dtype=kv_cache_dtype, handoff=settings)
    console = Console(stderr=True)
    with console.status(f"starting {prefill_workers} prefill and {decode_workers} decode workers on Ray"):
        pool = RayWorkerPool(config, start_worker_server, address=ray_address)
    console.print(f"prefill workers: {', '.join(pool.urls('prefill'))}; decode workers: {', '.join(pool.urls('decode'))}")
    try:
        uvicorn.run(create_front_app(FrontConfig.of(settings), pool), host=host,
                    port=port, access_log=False, log_level="info")
    finally:
        pool.shutdown()
