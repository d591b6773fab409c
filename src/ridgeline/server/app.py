"""The FastAPI application: OpenAI-compatible routes over one engine, plus health, metrics, (de)tokenize and
the tokenizer's configuration."""

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ridgeline.cluster.handoff import KV_LEASE_SECONDS
from ridgeline.cluster.kv_transfer.source import KVSource
from ridgeline.cluster.kv_transfer.zmq_transport import ZmqKVServer, ZmqTransport, advertised
from ridgeline.dashboard.feed import DashboardFeed
from ridgeline.dashboard.worker import LocalWorker
from ridgeline.errors import RidgelineError
from ridgeline.napkin.hardware import THIS_MACHINE
from ridgeline.server.async_engine import AsyncEngine, EngineFront
from ridgeline.server.chat import create_chat_completion
from ridgeline.server.chat_tools import chat_prompt_ids
from ridgeline.server.completions import create_completion
from ridgeline.server.dashboard import install_dashboard
from ridgeline.server.disaggregation import ROLES, WorkerRole
from ridgeline.server.disaggregation_messages import KVLookupAnswer, TokenizeAnswer
from ridgeline.server.engine_core.client import ProcessEngine
from ridgeline.server.engine_core.process import CoreProcess
from ridgeline.server.errors import APIError, error_response, install_error_handlers
from ridgeline.server.kv_intake import MAX_KV_WAITING
from ridgeline.server.metrics import LiveCost, ServerMetrics
from ridgeline.server.middleware import ApiKeyMiddleware, ApiServerHeaderMiddleware, BodySizeLimitMiddleware
from ridgeline.server.openapi import install_openapi
from ridgeline.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    KVLookupRequest,
    KVReleaseRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from ridgeline.server.serving import ServingContext
from ridgeline.server.slow_clients import REQUEST_READ_SECONDS
from ridgeline.server.tenants import install_tenancy, refresh_metrics, reload_on_sighup
from ridgeline.server.tokenizer_info import tokenizer_info
from ridgeline.tenancy.gate import TenantGate


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # None: no key required
    served_model_name: str | None = None  # None: the engine's model name (from the file or directory)
    max_waiting: int = 256  # requests queued beyond the running batch before new ones get 503
    max_body_bytes: int = 4 * 1024 * 1024
    drain_timeout: float = 30.0  # on shutdown, seconds in-flight requests get to finish before being aborted
    log_prompts: bool = False
    role: str = "both"  # "prefill" or "decode": one side of disaggregated serving (server/disaggregation.py)
    kv_bind: str = "tcp://127.0.0.1:*"  # a prefill worker's KV endpoint (port * = any free port)
    kv_advertise_host: str | None = None  # the host decode workers reach it at, if not the bound one
    kv_lease_seconds: float = KV_LEASE_SECONDS  # a prefill worker frees pages no decode worker collected within this
    kv_link_bytes_per_second: float | None = None  # a prefill worker paces its KV pages so (emulates a slow link)
    max_kv_waiting: int = MAX_KV_WAITING  # a decode worker's requests waiting for KV room beyond which it refuses
    request_read_timeout: float = REQUEST_READ_SECONDS  # to send a whole request (slow clients: slow_clients.py)
    max_connections: int | None = 4096  # beyond this uvicorn answers 503 at once instead of taking the socket
    hardware: str = THIS_MACHINE  # the machine the dashboard's roofline is drawn for (catalogue name or measured)
    tenants_file: str | None = None  # tenants, keys and limits (tenancy/config.py); None: --api-key alone, or open
    usage_db: str | None = None  # the tenants' shared usage store (SQLite); None: beside the tenants file
    usd_per_hour: float | None = None  # this machine's price: live $/Mtok in /metrics and the dashboard; None: unpriced
    api_server_index: int = 0  # which of api_server_count API processes this is (serve --api-server-count)
    api_server_count: int = 1  # API processes in front of one engine core (server/engine_core/api_servers.py)


def create_app(engine, config: ServerConfig) -> FastAPI:
    """`engine` is a ready LLMEngine, which the app drives from its own thread between startup and shutdown; or a
    started CoreProcess (server/engine_core/), whose engine steps in a process of its own."""
    if config.role not in ROLES:
        raise RidgelineError(f"unknown role {config.role!r} (choose from {', '.join(ROLES)})")
    model_name = config.served_model_name or engine.model_name
    metrics = ServerMetrics(model_name, summed=config.api_server_count > 1)  # several: each reports them all
    if config.usd_per_hour is not None:
        if config.usd_per_hour < 0:
            raise RidgelineError(f"usd_per_hour must be >= 0, got {config.usd_per_hour}")
        if isinstance(engine, CoreProcess):
            # The live figure reads the engine's step records, which stay in the core's process.
            raise RidgelineError("--usd-per-hour needs the engine in this process (--engine-core thread)")
        recorder = engine.steps
        metrics.enable_cost(LiveCost(config.usd_per_hour, lambda: (recorder.recent(), recorder.num_recorded),
                                     started=time.time()))
    max_num_seqs = engine.config.scheduler.max_num_seqs
    driver: EngineFront
    if isinstance(engine, CoreProcess):
        if config.role != "both":  # a prefill worker's KV source and a decode worker's intake read the engine here
            raise RidgelineError(f"--role {config.role} needs the engine in this process (--engine-core thread)")
        feed = DashboardFeed(None, view=engine.ready.view)
        driver = ProcessEngine(engine, metrics, max_num_seqs, config.max_waiting, feed=feed,
                               api_servers=config.api_server_count)
    else:
        feed = DashboardFeed(engine)
        driver = AsyncEngine(engine, metrics, max_num_seqs, config.max_waiting,
                             kv_transport=ZmqTransport() if config.role == "decode" else None, feed=feed,
                             max_kv_waiting=config.max_kv_waiting)
    role = WorkerRole(config.role)
    kv_server: ZmqKVServer | None = None
    tenants = TenantGate(config.tenants_file, config.usage_db, config.api_key) if config.tenants_file else None
    ctx = ServingContext(
        engine=driver,
        tokenizer=engine.tokenizer,
        admission=engine.admission,
        model_name=model_name,
        log_prompts=config.log_prompts,
        role=role,
        tenants=tenants,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        nonlocal kv_server
        await driver.start()
        if tenants is not None:
            reload_on_sighup(tenants)
        if config.role == "prefill":
            role.kv_source = KVSource(engine, config.kv_lease_seconds, lock=driver.engine_access())
            role.kv_source.attach(driver.thread)  # offers, pulls, keep-alives and releases never wait on the engine
            kv_server = ZmqKVServer(role.kv_source, config.kv_bind, link_bytes_per_second=config.kv_link_bytes_per_second)
            role.kv_address = advertised(kv_server.address, config.kv_advertise_host)
        yield
        if kv_server is not None:
            kv_server.close()
        await driver.shutdown(config.drain_timeout)
        if tenants is not None:
            tenants.close()

    app = FastAPI(title="ridgeline", lifespan=lifespan)
    app.state.serving = ctx
    # On the first SIGTERM (server/launcher.py's GracefulServer), before uvicorn waits for connections: the drain
    # runs while they are still open, so what outlives the grace is told so explicitly rather than cut.
    app.state.begin_shutdown = lambda grace: asyncio.ensure_future(driver.drain(grace))
    app.state.metrics = metrics
    install_error_handlers(app)
    install_openapi(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=config.max_body_bytes)
    if config.api_key or tenants is not None:  # outermost: no key, no body read
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key, tenants=tenants)
    if config.api_server_count > 1:
        app.add_middleware(ApiServerHeaderMiddleware, index=config.api_server_index)  # outermost: on every answer
        metrics.describe_api_server(config.api_server_index, config.api_server_count)
    tenant_metrics = None
    if tenants is not None:
        tenant_metrics = install_tenancy(app, tenants)
        metrics.add_tenants(tenant_metrics)  # the shared store's totals: the server's already, never summed

    def respond(result: BaseModel | Response | None) -> Response:
        if isinstance(result, Response):
            return result
        if result is None:  # the client left before the answer was ready
            return Response(status_code=204)
        return JSONResponse(result.model_dump(mode="json"))

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw: Request) -> Response:
        return respond(await create_completion(ctx, request, raw))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, raw: Request) -> Response:
        return respond(await create_chat_completion(ctx, request, raw))

    @app.get("/v1/models")
    async def models() -> Response:
        return respond(ModelList(data=[ModelCard(id=model_name, max_model_len=ctx.max_model_len)]))

    @app.get("/health")
    async def health() -> Response:
        if driver.healthy and driver.accepting:
            return Response(status_code=200)
        return error_response(503, "engine is not running" if not driver.healthy else "server is shutting down")

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        # The engine's gauges are those of its last published snapshot (after every step, and after pages freed
        # off the engine thread): a scrape never takes the engine lock, which a long prefill step holds for
        # seconds, and so never stalls this event loop (health checks, every stream).
        if tenant_metrics is not None:
            await refresh_metrics(tenants, tenant_metrics)
        if kv_server is not None:
            metrics.kv_pages_sent.set(kv_server.pages_sent)
            metrics.kv_bytes_sent.set(kv_server.page_bytes_sent)
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/kv/release")
    async def release_kv(request: KVReleaseRequest) -> Response:
        """A front's word that nobody will collect a request's pages (its client left between prefill and decode):
        `request_id` is the id in the prefill worker's answer, or the `front_request_id` the front sent with the
        request (whose answer it may never have read). Pages not held yet are freed as the request finishes."""
        if role.kv_source is None:
            raise APIError(400, "this server is not a prefill worker", "request_id")
        # (request: the front's KVRelease, server/disaggregation_messages.py, validated as its pydantic model)
        await asyncio.to_thread(role.kv_source.release, request.request_id)  # may take the engine: off the loop
        return JSONResponse({"released": request.request_id})

    @app.post("/v1/kv/lookup")
    async def lookup_kv(request: KVLookupRequest) -> Response:
        """How many leading tokens of this prompt the prefix cache holds (whole blocks of sha256 chain hashes): a
        front prefills on this worker what is cached or short enough, and moves KV only for the rest."""
        ctx.check_model(request.model)
        if request.messages is not None:
            tokens = chat_prompt_ids(ctx, request)
        else:
            tokens = ctx.prompt_ids(request.prompt, "prompt", special=ctx.text_special(request.split_special_tokens))
        intake = driver.kv_intake
        return JSONResponse(KVLookupAnswer(len(tokens), engine.cached_prefix_tokens(tokens),
                                           # whether a decode worker takes one more remote prefill now (a front
                                           # refuses if not)
                                           accepting=driver.accepting and driver.healthy and intake.accepting,
                                           kv_waiting=intake.num_waiting, max_kv_waiting=intake.max_waiting,
                                           max_model_len=ctx.max_model_len).to_json())

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> Response:
        ctx.check_model(request.model)
        if request.messages is not None:
            tokens = chat_prompt_ids(ctx, request)
        else:
            tokens = ctx.tokenizer.encode(request.prompt, add_bos=None if request.add_special_tokens else False,
                                          special=ctx.text_special(request.split_special_tokens))
        return JSONResponse(TokenizeAnswer(tuple(tokens), ctx.max_model_len).to_json())

    @app.get("/tokenizer_info")
    async def get_tokenizer_info() -> Response:
        return respond(tokenizer_info(ctx.tokenizer, ctx.max_model_len))

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> Response:
        ctx.check_model(request.model)
        ctx.prompt_ids(request.tokens, "tokens")  # range check
        return JSONResponse({"prompt": ctx.tokenizer.decode(request.tokens)})

    worker_role = "prefill+decode" if config.role == "both" else config.role
    install_dashboard(app, [LocalWorker("local", worker_role, model_name, engine, feed, config.hardware)], metrics,
                      lambda: driver.accepting)
    return app
