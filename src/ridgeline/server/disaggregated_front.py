"""`ridgeline proxy`: one OpenAI endpoint in front of prefill and decode workers (`ridgeline serve --role ...`).

Each request goes to a prefill worker with max_tokens=1 and `kv_transfer_params.do_remote_decode`, then to a decode
worker with the `kv_transfer_params` the prefill worker answered; the decode worker pulls the KV pages and streams
the whole answer, so the client sees an ordinary response or stream (usage, logprobs, stop strings as colocated;
TTFT includes the transfer). Conditional disaggregation: a prompt whose part the decode worker's prefix cache does
not hold is shorter than `local_prefill_tokens` (below it the transfer costs more than the prefill saves, see
`ridgeline advise`), or one that needs what only a full prefill on the decode side gives (n > 1, echo, several
prompts), is sent to the decode worker alone, which prefills (the uncached part of) it itself.

Failures end explicitly: an error from a worker is passed on as it came; a decode worker that dies mid-stream ends
the stream with an error event; a client that leaves between prefill and decode gets its pages released at once.
"""

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from ridgeline.server.errors import error_response

logger = logging.getLogger("ridgeline.server.front")
# A worker that is not there (any more): refused, or a pooled connection to a process that died. Before a response
# has started, the request can go to another (or a restarted) worker.
WORKER_GONE = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class FrontConfig:
    prefill_urls: tuple[str, ...] = ()
    decode_urls: tuple[str, ...] = ()
    local_prefill_tokens: int = 64  # prompts whose uncached part is shorter are prefilled on the decode worker
    timeout: float = 600.0


class StaticPool:
    """Workers at fixed URLs (a pool on Ray, cluster/ray_pool.py, has the same two methods and finds them anew)."""

    def __init__(self, prefill: tuple[str, ...], decode: tuple[str, ...]):
        self._urls = {"prefill": list(prefill), "decode": list(decode)}

    def urls(self, role: str) -> list[str]:
        return self._urls[role]

    def refresh(self) -> None:
        pass


class DisaggregatedFront:
    def __init__(self, config: FrontConfig, pool=None):
        self.pool = pool or StaticPool(config.prefill_urls, config.decode_urls)
        if not self.pool.urls("prefill") or not self.pool.urls("decode"):
            raise ValueError("a disaggregated front needs at least one prefill and one decode worker")
        self.config = config
        self._turn = {"prefill": itertools.count(), "decode": itertools.count()}
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout, connect=5.0))
        self.registry = CollectorRegistry()
        self.placements = Counter("ridgeline_front_prefills", "Prefills by where they ran: on a prefill worker "
                                  "(remote) or on the decode worker (local).", ["placement"], registry=self.registry)
        self.failures = Counter("ridgeline_front_failures", "Requests that ended in a worker's error.", ["stage"],
                                registry=self.registry)

    def _pick(self, role: str) -> str:
        """Round robin over the role's live workers."""
        urls = self.pool.urls(role)
        return urls[next(self._turn[role]) % len(urls)]

    async def handle(self, path: str, raw: Request) -> Response:
        """One request; a worker that cannot be reached makes the pool look again (Ray may have restarted it
        elsewhere) and the request is tried once more."""
        body = await raw.json()
        try:
            return await self._handle(path, body, raw)
        except WORKER_GONE:
            await asyncio.to_thread(self.pool.refresh)
        try:
            return await self._handle(path, body, raw)
        except WORKER_GONE as error:
            self.failures.labels("connect").inc()
            return error_response(502, f"no worker could be reached: {error!r}", code="worker_unreachable")

    async def _handle(self, path: str, body: dict, raw: Request) -> Response:
        decode_url, prefill_url = self._pick("decode"), self._pick("prefill")
        if not await self._worth_a_remote_prefill(body, decode_url, prefill_url):
            self.placements.labels("local").inc()
            return await self._forward(decode_url, path, body)
        self.placements.labels("remote").inc()
        prefill_body = {**body, "stream": False, "stream_options": None, "max_tokens": 1,
                        "kv_transfer_params": {"do_remote_decode": True}}
        if "max_completion_tokens" in body and body["max_completion_tokens"] is not None:
            prefill_body["max_completion_tokens"] = 1
            prefill_body.pop("max_tokens")
        try:
            prefilled = await self.client.post(f"{prefill_url}{path}", json=prefill_body)
        except WORKER_GONE:
            raise  # handle() looks for the worker again
        except httpx.HTTPError as error:
            self.failures.labels("prefill").inc()
            return error_response(502, f"prefill worker {prefill_url} failed: {error!r}", code="prefill_failed")
        if prefilled.status_code != 200:
            self.failures.labels("prefill").inc()
            return Response(prefilled.content, prefilled.status_code, media_type="application/json")
        kv = prefilled.json().get("kv_transfer_params")
        if kv is None:  # finished at its first token: the decode worker redoes the (rare) whole request itself
            return await self._forward(decode_url, path, body)
        if await raw.is_disconnected():
            await self._release(prefill_url, kv)
            return Response(status_code=204)
        decode_body = {**body, "kv_transfer_params": {**kv, "do_remote_prefill": True}}
        if isinstance(body.get("prompt"), str):
            # The prefill worker tokenised the prompt already; its ids, from the manifest, spare the decode worker
            # doing it again on its own core with the GIL held (~24 ms per 2,000 words there, a stall of every
            # stream it decodes). The decode worker still checks them against the pages' chain hashes.
            decode_body["prompt"] = kv["manifest"]["prompt_token_ids"]
        return await self._forward(decode_url, path, decode_body, on_unsent=lambda: self._release(prefill_url, kv))

    async def _worth_a_remote_prefill(self, body: dict, decode_url: str, prefill_url: str) -> bool:
        """Whether the prompt's uncached part is worth a prefill worker. The decode worker is asked what its prefix
        cache holds (POST /v1/kv/lookup): a repeated prompt, or one whose new part is short, is prefilled there --
        only its uncached part -- and moves no KV at all. The prefill worker tokenises the prompt for that question
        (POST /tokenize): on the decode worker it would run on the core that steps every stream, in pure Python
        with the GIL held (~24 ms per 2,000 words warm, ~170 ms the first time), a stall of all of them."""
        if body.get("n", 1) != 1 or body.get("echo") or (body.get("max_tokens") == 1):
            return False
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return False  # several prompts in one request
        try:
            if isinstance(prompt, list):
                ids = prompt  # token ids already
            else:
                ask = {"messages": body["messages"]} if "messages" in body else {"prompt": prompt}
                for key in ("add_generation_prompt", "split_special_tokens"):  # tokenized as the request will be
                    if key in body:
                        ask[key] = body[key]
                tokenized = await self.client.post(f"{prefill_url}/tokenize", json=ask)
                if tokenized.status_code != 200:
                    return False  # let the decode worker answer whatever is wrong with it
                ids = tokenized.json()["tokens"]
            answer = await self.client.post(f"{decode_url}/v1/kv/lookup", json={"prompt": ids})
            held = answer.json()
            uncached = held["prompt_tokens"] - held["cached_tokens"]
        except WORKER_GONE:
            raise  # handle() looks for the worker again
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            return False  # let the decode worker answer whatever is wrong with it
        return answer.status_code == 200 and uncached >= self.config.local_prefill_tokens

    async def _release(self, prefill_url: str, kv: dict) -> None:
        try:
            await self.client.post(f"{prefill_url}/v1/kv/release", json={"request_id": kv["manifest"]["request_id"]})
        except httpx.HTTPError:
            logger.warning("could not release KV at %s; its lease will", prefill_url)

    async def _forward(self, url: str, path: str, body: dict, on_unsent=None) -> Response:
        request = self.client.build_request("POST", f"{url}{path}", json=body)
        try:
            upstream = await self.client.send(request, stream=True)
        except WORKER_GONE:
            if on_unsent is not None:
                await on_unsent()
            raise  # handle() looks for the worker again
        except httpx.HTTPError as error:
            self.failures.labels("decode").inc()
            if on_unsent is not None:
                await on_unsent()
            return error_response(502, f"decode worker {url} failed: {error!r}", code="decode_failed")
        if not body.get("stream") or upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            return Response(content, upstream.status_code, media_type=upstream.headers.get("content-type"))
        return StreamingResponse(self._relay(upstream, url), media_type="text/event-stream")

    async def _relay(self, upstream: httpx.Response, url: str) -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.HTTPError as error:  # the decode worker died mid-stream: end with an error, never hang
            self.failures.labels("decode").inc()
            message = {"error": {"message": f"decode worker {url} failed mid-stream: {error!r}",
                                 "type": "server_error", "param": None, "code": "decode_failed"}}
            yield f"data: {json.dumps(message)}\n\ndata: [DONE]\n\n".encode()
        finally:
            await upstream.aclose()


def create_front_app(config: FrontConfig, pool=None) -> FastAPI:
    front = DisaggregatedFront(config, pool)
    app = FastAPI(title="ridgeline disaggregated front")

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await front.handle("/v1/completions", raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await front.handle("/v1/chat/completions", raw)

    @app.get("/v1/models")
    async def models() -> Response:
        for attempt in range(2):
            try:
                answer = await front.client.get(f"{front._pick('decode')}/v1/models")
                return JSONResponse(answer.json(), answer.status_code)
            except WORKER_GONE:
                if attempt == 0:
                    await asyncio.to_thread(front.pool.refresh)
        return error_response(502, "no decode worker could be reached", code="worker_unreachable")

    @app.get("/health")
    async def health() -> Response:
        for url in (*front.pool.urls("prefill"), *front.pool.urls("decode")):
            try:
                if (await front.client.get(f"{url}/health", timeout=5.0)).status_code != 200:
                    return error_response(503, f"worker {url} is unhealthy")
            except httpx.HTTPError:
                return error_response(503, f"worker {url} is unreachable")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(front.registry), media_type=CONTENT_TYPE_LATEST)

    app.state.front = front
    return app
