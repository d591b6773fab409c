"""The router's OpenAI endpoint: every model of the router (cluster/router.py) plus the virtual model `auto`.

A request naming a ridgeline model is served by the same completions and chat code as a one-model server; only
the engine underneath is the router's choice of replica (RoutedEngine). A request naming an OpenAI-server model
goes through as sent. `auto` first asks the router which model is worth its cost for the prompt.
"""

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from ridgeline.cluster.build import estimate_tokens, question_text, sample_text
from ridgeline.cluster.errors import NoReplicaAvailable, ReplicaError
from ridgeline.cluster.messages import GenerateRequest
from ridgeline.cluster.router import Router
from ridgeline.engine.messages import AddRequest
from ridgeline.server.async_engine import Submission
from ridgeline.server.chat import create_chat_completion
from ridgeline.server.client_watch import ClientLeft, DeadlinePassed, while_client_waits
from ridgeline.server.completions import create_completion
from ridgeline.server.deadline import deadline_error, request_deadline
from ridgeline.server.deadline import forwarded as forwarded_deadline
from ridgeline.server.drain import Drain, DrainGate
from ridgeline.server.errors import APIError, error_response, install_error_handlers, validation_message
from ridgeline.server.middleware import ApiKeyMiddleware, BodySizeLimitMiddleware
from ridgeline.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from ridgeline.server.serving import ServingContext, new_request_id
from ridgeline.server.tenants import install_tenancy, refresh_metrics, reload_on_sighup
from ridgeline.tenancy.gate import TenantGate

AUTO = "auto"
logger = logging.getLogger("ridgeline.router")


def api_error(error: ReplicaError) -> APIError:
    headers = {"Retry-After": _seconds(error.retry_after)} if error.status in (429, 503) else None
    return APIError(error.status, str(error), code=error.code, headers=headers)


def _seconds(retry_after: float | None) -> str:
    return f"{max(1, math.ceil(retry_after or 1))}"


def replica_error_response(error: ReplicaError) -> Response:
    """What the client gets when no replica served its request. A backend that refused it as busy (429/503: a
    disaggregated front whose decode side is full, a server at capacity) is passed on as it answered -- its status,
    its error body, its Retry-After -- when no other replica took the request: busy is never made a 4xx or a 502."""
    busy = getattr(error, "busy", None)
    if busy is not None and busy.body:
        try:
            reason = json.loads(busy.body)["error"]
        except (ValueError, KeyError, TypeError):
            reason = None
        if isinstance(reason, dict):
            return Response(busy.body, busy.status, media_type="application/json",
                            headers={"Retry-After": _seconds(error.retry_after)})
    failed = api_error(error)
    return error_response(failed.status, str(failed), code=failed.code, headers=failed.headers)


class RoutedSubmission(Submission):
    """The engine requests of one HTTP request, each streamed from the replica the router picked for it; a
    Submission (server/async_engine.py) to the completions and chat code, which need no change."""

    def __init__(self, router: Router, model: str, requests: list[AddRequest]):
        super().__init__(None, [r.request_id for r in requests])
        self._tasks = [asyncio.create_task(self._pump(router, model, index, r)) for index, r in enumerate(requests)]

    async def _pump(self, router: Router, model: str, index: int, request: AddRequest) -> None:
        # Each choice is routed on its own (a replica may take any of them), so n > 1 shares no pages via fork_of.
        admitted = request.request
        try:
            async for output in router.generate(model, GenerateRequest(request.request_id,
                                                                       list(admitted.prompt_token_ids), admitted.params)):
                self.queue.put_nowait((index, output))
        except ReplicaError as error:
            self.queue.put_nowait(api_error(error))

    def close(self, why: str | None = None) -> None:
        """Client gone, error or done: cancelling a pump aborts its request on the replica (a Ray replica's
        generate tells its actor to abort; a worker's thread frees the pages)."""
        for task in self._tasks:
            task.cancel()
        self._unfinished.clear()


class RoutedEngine:
    def __init__(self, router: Router, model: str):
        self.router = router
        self.model = model

    def submit(self, requests: list[AddRequest]) -> RoutedSubmission:
        if not self.router.usable(self.model):
            raise APIError(503, f"no replica of {self.model!r} is up; retry later", code="no_backend_available",
                           headers={"Retry-After": _seconds(self.router.retry_after(self.model))})
        return RoutedSubmission(self.router, self.model, requests)


def _prompt_tokens(body: dict, chars_per_token: float = 4.0) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    return estimate_tokens(sample_text(body), chars_per_token)


def _auto_prompt_tokens(router: Router, body: dict) -> int | dict[str, int]:
    """The prompt's length for `auto`: a token id list's own, else each model's count (its tokenizer where held)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    return router.count_prompt_tokens(sample_text(body))


def create_router_app(router: Router | Callable[[], Awaitable[Router]], api_key: str | None = None,
                      max_body_bytes: int = 4 * 1024 * 1024, log_prompts: bool = False,
                      tenants: TenantGate | None = None) -> FastAPI:
    """`router`: a started Router (the caller closes it), or an async factory the app calls at startup (the app
    then closes what it built at shutdown), so the replicas and health loop live on the server's event loop.
    `tenants`: per-tenant keys, limits and usage (the app closes it at shutdown); the router's replicas and any
    other router or server given the same usage file count into the same limits."""
    contexts: dict[str, ServingContext] = {}
    tenant_metrics = None

    def adopt(built: Router) -> None:
        nonlocal router
        router = built
        app.state.router = built
        contexts.update({
            name: ServingContext(engine=RoutedEngine(built, name), tokenizer=group.tokenizer, admission=group.admission,
                                 model_name=name, log_prompts=log_prompts, tenants=tenants)
            for name, group in built.groups.items() if not group.is_http
        })
        if tenant_metrics is not None:
            built.metrics.registry.register(tenant_metrics)

    factory = router if not isinstance(router, Router) else None

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if factory is not None:
            adopt(await factory())
        if tenants is not None:
            reload_on_sighup(tenants)
        yield
        if factory is not None:
            await router.close()
        if tenants is not None:
            tenants.close()

    app = FastAPI(title="ridgeline router", lifespan=lifespan)
    if tenants is not None:
        tenant_metrics = install_tenancy(app, tenants)
    if factory is None:
        adopt(router)
    install_error_handlers(app)
    # SIGTERM (server/launcher.py): past the grace, what is still in flight gets the router's own 503 / error
    # event, and its replica requests are cancelled (server/drain.py)
    drain = Drain()
    app.add_middleware(DrainGate, drain=drain)
    app.state.begin_shutdown = drain.begin
    app.state.drain = drain
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes)
    if api_key or tenants is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, tenants=tenants)

    def respond(result) -> Response:
        if isinstance(result, Response):
            return result
        if result is None:
            return Response(status_code=204)
        return JSONResponse(result.model_dump(mode="json"))

    async def route(raw: Request, path: str, request_class: type[BaseModel], handler) -> Response:
        try:
            body = json.loads(await raw.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise APIError(400, "request body must be a JSON object")
        model = body.get("model") or AUTO
        started = time.perf_counter()
        try:
            if model == AUTO:
                max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
                decision = router.decide_auto(_auto_prompt_tokens(router, body),
                                              max_tokens if isinstance(max_tokens, int) else None, question_text(body))
                model = decision.model
            if model not in router.groups:
                raise APIError(404, f"model {model!r} does not exist; this router serves "
                                    f"{', '.join([AUTO, *router.groups])}", "model", "model_not_found")
            group = router.group(model)
            if group.is_http:
                # Until the replica's answer starts, the client is watched: if it leaves (or its deadline passes)
                # the forward is cancelled, closing the connection the replica aborts on; a stream is Starlette's
                # from there, which cancels the relay (and so the upstream stream) when the client goes.
                deadline = request_deadline(raw.headers)
                try:
                    forwarded = await while_client_waits(raw, router.forward(
                        model, path, body, _prompt_tokens(body, group.chars_per_token), new_request_id("route"),
                        forwarded_deadline(deadline)), deadline)
                except ClientLeft:
                    return Response(status_code=204)  # nobody reads it
                except DeadlinePassed:
                    raise deadline_error() from None
                return StreamingResponse(forwarded.body, status_code=forwarded.status, media_type=forwarded.content_type,
                                         headers=forwarded.headers)
            try:
                request = request_class.model_validate({**body, "model": model})
            except ValidationError as error:
                message, param = validation_message(list(error.errors()))
                return error_response(400, message, param)
            return respond(await handler(contexts[model], request, raw))
        except ReplicaError as error:
            return replica_error_response(error)
        finally:
            logger.debug("routed to %s in %.3f ms", model, (time.perf_counter() - started) * 1e3)

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await route(raw, "/v1/completions", CompletionRequest, create_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await route(raw, "/v1/chat/completions", ChatCompletionRequest, create_chat_completion)

    @app.get("/v1/models")
    async def models() -> Response:
        cards = [ModelCard(id=name, max_model_len=g.max_model_len or 0, owned_by="ridgeline" if not g.is_http else "remote")
                 for name, g in router.groups.items()]
        longest = max(c.max_model_len for c in cards)
        return respond(ModelList(data=[ModelCard(id=AUTO, max_model_len=longest, owned_by="ridgeline-router"), *cards]))

    @app.get("/health")
    async def health() -> Response:
        if any(router.usable(name) for name in router.groups):
            return Response(status_code=200)
        return error_response(503, "no backend is up", code=NoReplicaAvailable.code, headers={"Retry-After": "1"})

    @app.get("/metrics")
    async def metrics() -> Response:
        if tenant_metrics is not None:
            await refresh_metrics(tenants, tenant_metrics)
        return Response(router.metrics.render(), media_type=router.metrics.content_type)

    @app.get("/router/replicas")
    async def replicas() -> Response:
        """Each replica's health, counted load and rates: what the router bases its choices on."""
        rows = []
        for name, replica in router.replicas.items():
            load, rates, health = router.loads.of(name), router.rates[name], router.health[name]
            rows.append({"replica": name, "model": replica.model, "kind": replica.kind, "state": health.state,
                         "last_error": health.last_error, "in_flight": load.num_in_flight,
                         "prefill_backlog_tokens": load.prefill_backlog, "cached_blocks": router.index.num_blocks(name),
                         "blocks_in_use": router.index.blocks_in_use(name),
                         "cache_blocks": getattr(getattr(replica, "info", None), "cache_blocks", None),
                         "prefill_tokens_per_s": round(rates.prefill_tokens_per_s, 1),
                         "decode_tokens_per_s": round(rates.decode_tokens_per_s, 2), "rates_from": rates.source,
                         "usd_per_hour": router.prices.get(name),
                         "usd_per_mtok": dict(zip(("prompt", "completion"), prices)) if (prices := router.usd_per_mtok(name)) else None})
        return JSONResponse({"threshold": router.threshold, "objective": router.objective, "replicas": rows})

    return app
