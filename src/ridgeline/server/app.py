"""The FastAPI application: OpenAI-compatible routes over one engine, plus health, metrics and (de)tokenize."""

from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ridgeline.server.async_engine import AsyncEngine
from ridgeline.server.chat import create_chat_completion
from ridgeline.server.completions import create_completion
from ridgeline.server.errors import error_response, install_error_handlers
from ridgeline.server.metrics import ServerMetrics
from ridgeline.server.middleware import ApiKeyMiddleware, BodySizeLimitMiddleware
from ridgeline.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from ridgeline.server.serving import ServingContext


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


def create_app(engine, config: ServerConfig) -> FastAPI:
    """`engine` is a ready LLMEngine; the app drives it from its own thread between startup and shutdown."""
    model_name = config.served_model_name or engine.model_name
    metrics = ServerMetrics(model_name)
    driver = AsyncEngine(engine, metrics, engine.config.scheduler.max_num_seqs, config.max_waiting)
    ctx = ServingContext(
        engine=driver,
        tokenizer=engine.tokenizer,
        admission=engine.admission,
        model_name=model_name,
        log_prompts=config.log_prompts,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await driver.start()
        yield
        await driver.shutdown(config.drain_timeout)

    app = FastAPI(title="ridgeline", lifespan=lifespan)
    app.state.serving = ctx
    app.state.metrics = metrics
    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)  # outermost: no key, no body read

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
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> Response:
        ctx.check_model(request.model)
        if request.messages is not None:
            messages = [{"role": m.role, "content": m.text()} for m in request.messages]
            tokens = ctx.chat_prompt_ids(messages, request.add_generation_prompt)
        else:
            tokens = ctx.tokenizer.encode(request.prompt, add_bos=None if request.add_special_tokens else False)
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": ctx.max_model_len})

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> Response:
        ctx.check_model(request.model)
        ctx.prompt_ids(request.tokens, "tokens")  # range check
        return JSONResponse({"prompt": ctx.tokenizer.decode(request.tokens)})

    return app
