"""`ridgeline proxy`: one OpenAI endpoint in front of prefill and decode workers (`ridgeline serve --role ...`).

Each request goes to a prefill worker with max_tokens=1 and `kv_transfer_params.do_remote_decode`, then to a decode
worker with the `kv_transfer_params` the prefill worker answered; the decode worker pulls the KV pages and streams
the whole answer, so the client sees an ordinary response or stream (usage, logprobs, stop strings as colocated;
TTFT includes the transfer). Conditional disaggregation: a prompt whose part the decode worker's prefix cache does
not hold is shorter than `local_prefill_tokens` (below it the transfer costs more than the prefill saves, see
`ridgeline advise`), or one that needs what only a full prefill on the decode side gives (n > 1, echo, several
prompts), is sent to the decode worker alone, which prefills (the uncached part of) it itself.

Nothing accepted is lost. Once a request is sent to a prefill worker it ends in exactly one of: the whole answer;
the answer after a transparent re-prefill (the held pages were gone when the decode worker came for them -- a
lease lapsed, the prefill worker restarted: at most `max_reprefills` times, counted in /metrics and told in the
`x-ridgeline-reprefills` header); or an explicit server-side error: 429/503 with Retry-After before the first byte
(counted as refusals in /metrics), an error event after it. A valid request is never answered 4xx: only the
workers' own validation of the client's request is.

- Backpressure before work: the decode worker says in its prefix-cache lookup whether it takes more remote KV
  (`accepting`, its queue of requests waiting for KV room against its bound); when it does not, the request is
  refused before any prefill is spent on it.
- Leases cannot lapse on the way: from the prefill worker's answer until a decode worker has taken the request,
  the front keeps the pages' lease alive (server/kv_leases.py, a thread of its own); the decode worker does from
  there until its pull.
- A decode worker gone (refused, restarted, shutting down) before it answered: the same pages go to the pool's
  next decode worker, once. A decode worker that dies mid-stream ends the stream with an error event.

Work nobody waits for stops (issue 38): the client's connection is watched the whole time the front waits on a
worker (server/client_watch.py). When the client leaves -- before its prefill was scheduled, during it, during the
KV transfer, during decode -- the upstream request is cancelled at once, which closes its connection: the worker
behind aborts it in its engine (queued or running) and frees its pages, and prefilled pages not yet taken are
released on the prefill worker. A request's deadline (`x-ridgeline-deadline-ms`, server/deadline.py) is kept the
same way here, and what is left of it is forwarded to each worker, which drops the request on its own when it
passes (after the stream started, the decode worker ends it with the error event).
"""

import asyncio
import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from ridgeline.cluster import handoff
from ridgeline.cluster.kv_transfer.messages import KVOffer, KVTransferParams, MalformedMessage
from ridgeline.cluster.kv_transfer.zmq_transport import ZmqTransport
from ridgeline.server.client_watch import ClientLeft, DeadlinePassed, while_client_waits
from ridgeline.server.deadline import Deadline, deadline_error, forwarded, request_deadline
from ridgeline.server.disaggregation_messages import KVLookupAnswer, KVRelease, TokenizeAnswer
from ridgeline.server.drain import Drain, DrainGate
from ridgeline.server.errors import APIError, error_response
from ridgeline.server.kv_leases import LeaseKeeper
from ridgeline.server.protocol import KVLookupRequest

logger = logging.getLogger("ridgeline.server.front")
# A worker that is not there (any more): refused, or a pooled connection to a process that died. Before a response
# has started, the request can go to another (or a restarted) worker.
WORKER_GONE = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
REPREFILLS_HEADER = "x-ridgeline-reprefills"
RETRY_AFTER_SECONDS = "1"
# A decode worker's 503s that say the worker itself cannot take it now (not the pages): the pool's next one may
# (as after its 5xx other than 503: one that fails as it is restarted).
DECODE_GONE_CODES = ("shutting_down", "engine_dead")
# A decode worker's 503s that say it is full for now: a prefilled request waits for room (FrontConfig.handoff_wait).
DECODE_FULL_CODES = ("kv_queue_full", "server_overloaded")
HANDOFF_RETRY_SECONDS = 0.5


@dataclass(frozen=True)
class FrontConfig:
    prefill_urls: tuple[str, ...] = ()
    decode_urls: tuple[str, ...] = ()
    local_prefill_tokens: int = handoff.LOCAL_PREFILL_TOKENS  # prompts whose uncached part is shorter are
    # prefilled on the decode worker
    timeout: float = 600.0
    max_reprefills: int = handoff.MAX_REPREFILLS  # prefills again of one request whose held pages were gone, before a 503
    # A prefilled request the decode worker has no room to take yet (its KV queue full) waits here this long, its
    # pages kept alive, before a 503: the prefill is spent already, and the queue drains as its requests pull.
    handoff_wait: float = handoff.HANDOFF_WAIT_SECONDS

    @classmethod
    def of(cls, settings: handoff.HandoffConfig, prefill_urls: tuple[str, ...] = (),
           decode_urls: tuple[str, ...] = ()) -> "FrontConfig":
        """The front's part of a deployment's hand-off settings (the workers read theirs from the same value)."""
        return cls(tuple(prefill_urls), tuple(decode_urls), settings.local_prefill_tokens,
                   max_reprefills=settings.max_reprefills, handoff_wait=settings.handoff_wait)


class StaticPool:
    """Workers at fixed URLs (a pool on Ray, cluster/ray_pool.py, has the same two methods and finds them anew)."""

    def __init__(self, prefill: tuple[str, ...], decode: tuple[str, ...]):
        self._urls = {"prefill": list(prefill), "decode": list(decode)}

    def urls(self, role: str) -> list[str]:
        return self._urls[role]

    def refresh(self) -> None:
        pass


class _PagesGone(Exception):
    """The decode worker found the prefilled pages gone (503 kv_pages_gone): prefill again."""


def _error_code(content: bytes, part: str = "code") -> str | None:
    """A worker's OpenAI-style error body's `code` (or another part); None where the body is not one."""
    try:
        value = json.loads(content)["error"][part]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None


class DisaggregatedFront:
    def __init__(self, config: FrontConfig, pool=None):
        self.pool = pool or StaticPool(config.prefill_urls, config.decode_urls)
        if not self.pool.urls("prefill") or not self.pool.urls("decode"):
            raise ValueError("a disaggregated front needs at least one prefill and one decode worker")
        self.config = config
        self._turn = {"prefill": itertools.count(), "decode": itertools.count()}
        # No cap on connections: one per request in flight, each to a prefill then a decode worker (a capped pool
        # queues requests here, invisibly, while their leases run).
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout, connect=5.0),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))
        self.leases = LeaseKeeper(ZmqTransport(timeout=5.0), name="ridgeline-front-kv-leases")
        self._handing_over: dict[str, int] = {}  # decode URL -> requests prefilled for it, not yet taken by it
        self._releasing: set[asyncio.Future] = set()  # releases by name on their way (kept: tasks are weakly held)
        self.registry = CollectorRegistry()
        self.placements = Counter("ridgeline_front_prefills", "Prefills by where they ran: on a prefill worker "
                                  "(remote) or on the decode worker (local).", ["placement"], registry=self.registry)
        self.failures = Counter("ridgeline_front_failures", "Requests that ended in a worker's error.", ["stage"],
                                registry=self.registry)
        self.reprefills = Counter("ridgeline_front_reprefills", "Prefills again of a request whose held KV pages "
                                  "were gone when its decode worker came for them.", registry=self.registry)
        self.handoff_waits = Counter("ridgeline_front_handoff_waits", "Prefilled requests that waited here for a "
                                     "decode worker whose KV queue was full.", registry=self.registry)
        self.refusals = Counter("ridgeline_front_refusals", "Requests answered 429/503 with Retry-After, before any "
                                "byte of an answer, by why.", ["reason"], registry=self.registry)
        self.client_left = Counter("ridgeline_front_client_left", "Requests whose client left before the answer "
                                   "started: their upstream requests cancelled.", registry=self.registry)
        self.released = Counter("ridgeline_front_cancelled_prefill_releases", "Releases sent to a prefill worker "
                                "for a prefill cancelled before its answer was read (by the name the front gave it).",
                                registry=self.registry)
        self.deadlines = Counter("ridgeline_front_deadline_exceeded", "Requests whose x-ridgeline-deadline-ms "
                                 "passed before the answer started: cancelled upstream, answered 504.",
                                 registry=self.registry)

    def _pick(self, role: str) -> str:
        """Round robin over the role's live workers."""
        urls = self.pool.urls(role)
        return urls[next(self._turn[role]) % len(urls)]

    async def _refresh(self) -> None:
        await asyncio.to_thread(self.pool.refresh)

    async def handle(self, path: str, raw: Request) -> Response:
        body = await raw.json()
        try:
            deadline = request_deadline(raw.headers)
        except APIError as error:
            return error_response(error.status, error.message, error.param, error.code)
        reprefills = [0]
        try:  # until the answer starts: a stream is Starlette's from there (it cancels the relay when the client goes)
            response = await while_client_waits(raw, self._handle_once_more(path, body, reprefills, deadline),
                                                deadline)
        except ClientLeft:
            self.client_left.inc()
            return Response(status_code=204)  # nobody reads it
        except DeadlinePassed:
            self.deadlines.inc()
            error = deadline_error()
            return error_response(error.status, error.message, code=error.code)
        if reprefills[0]:
            response.headers[REPREFILLS_HEADER] = str(reprefills[0])
        if response.status_code in (429, 503):
            if "retry-after" not in response.headers:
                response.headers["Retry-After"] = RETRY_AFTER_SECONDS
            self.refusals.labels(_error_code(getattr(response, "body", b"")) or "unavailable").inc()
        return response

    async def _handle_once_more(self, path: str, body: dict, reprefills: list[int],
                                deadline: Deadline | None) -> Response:
        """One request; a worker that cannot be reached before any work was handed over makes the pool look again
        (Ray may have restarted it elsewhere) and the request is tried once more."""
        try:
            return await self._handle(path, body, reprefills, deadline)
        except WORKER_GONE:
            await self._refresh()
        try:
            return await self._handle(path, body, reprefills, deadline)
        except WORKER_GONE as error:
            self.failures.labels("connect").inc()
            return error_response(503, f"no worker could be reached: {error!r}", code="worker_unreachable",
                                  headers={"Retry-After": RETRY_AFTER_SECONDS})

    async def _handle(self, path: str, body: dict, reprefills: list[int], deadline: Deadline | None) -> Response:
        decode_url, prefill_url = self._pick("decode"), self._pick("prefill")
        where = await self._where_to_prefill(body, decode_url, prefill_url)
        if isinstance(where, Response):
            return where  # refused before any prefill: the decode side takes no more now
        if where == "local":
            self.placements.labels("local").inc()
            return await self._forward(decode_url, path, body, deadline)
        while True:
            self.placements.labels("remote").inc()
            kv_or_answer = await self._prefill(prefill_url, path, body, deadline)
            if isinstance(kv_or_answer, Response):
                if _error_code(kv_or_answer.body) != "kv_pages_gone" or reprefills[0] >= self.config.max_reprefills:
                    return kv_or_answer
            else:
                kv = kv_or_answer
                if kv is None:  # finished at its first token: the decode worker redoes the (rare) whole request
                    return await self._forward(decode_url, path, body, deadline)
                try:
                    return await self._decode(decode_url, path, body, prefill_url, kv, deadline)
                except _PagesGone as gone:
                    if reprefills[0] >= self.config.max_reprefills:
                        self.failures.labels("pages_gone").inc()
                        return error_response(503, f"the prefilled KV pages were gone {reprefills[0] + 1} times, "
                                                   f"last: {gone}", code="kv_pages_gone",
                                              headers={"Retry-After": RETRY_AFTER_SECONDS})
            reprefills[0] += 1  # the pages are gone: prefill again, on the pool's next prefill worker
            self.reprefills.inc()
            prefill_url = self._pick("prefill")

    async def _prefill(self, prefill_url: str, path: str, body: dict,
                       deadline: Deadline | None) -> KVOffer | None | Response:
        """The prefill worker's offer of the pages it holds (None: it finished at its first token), or the answer
        to give the client (the prefill worker's own refusal of the request, or a 502, one naming the field of a
        malformed offer)."""
        # Named here, so that the pages can be released whether or not the answer is read: a front cancelled while
        # the answer is on the wire would otherwise never learn whose pages to release (held a whole lease).
        name = uuid.uuid4().hex
        prefill_body = {**body, "stream": False, "stream_options": None, "max_tokens": 1,
                        "kv_transfer_params": KVTransferParams(do_remote_decode=True, front_request_id=name).to_json()}
        if "max_completion_tokens" in body and body["max_completion_tokens"] is not None:
            prefill_body["max_completion_tokens"] = 1
            prefill_body.pop("max_tokens")
        try:
            # Cancelled (client left, deadline): the connection closes and the prefill worker aborts it there
            prefilled = await self.client.post(f"{prefill_url}{path}", json=prefill_body, headers=forwarded(deadline))
        except asyncio.CancelledError:
            # Cancelled (client left, deadline, shutdown) wherever the request was, its answer perhaps on the wire
            # already: the release by name frees the pages now or as the prefill finishes (a no-op if it never ran)
            self._release_soon(prefill_url, name)
            raise
        except httpx.ConnectError:
            raise  # nothing was sent: looked for again
        except WORKER_GONE:
            self._release_soon(prefill_url, name)  # a connection cut, the worker perhaps alive: looked for again
            raise
        except httpx.HTTPError as error:
            self._release_soon(prefill_url, name)
            self.failures.labels("prefill").inc()
            return error_response(502, f"prefill worker {prefill_url} failed: {error!r}", code="prefill_failed")
        if prefilled.status_code != 200:
            if prefilled.status_code >= 500:
                self.failures.labels("prefill").inc()
            return Response(prefilled.content, prefilled.status_code, media_type="application/json",
                            headers=_retry_after(prefilled))
        params = prefilled.json().get("kv_transfer_params")
        try:
            return None if params is None else KVOffer.from_json(params, "kv_transfer_params")
        except MalformedMessage as error:  # a worker of another version, or a bug: not the client's fault
            self.failures.labels("prefill").inc()
            return error_response(502, f"prefill worker {prefill_url} answered a {error.reason}",
                                  code="prefill_failed")

    async def _decode(self, decode_url: str, path: str, body: dict, prefill_url: str, kv: KVOffer,
                      deadline: Deadline | None) -> Response:
        """Hand the prefilled request to a decode worker; the pages' lease is kept alive until one has taken it.
        _PagesGone if the decode worker found them gone. Cancelled (the client left, its deadline passed): the
        pages are released on the prefill worker (a no-op if the decode worker pulled them already)."""
        decode_body = {**body, "kv_transfer_params": KVTransferParams(do_remote_prefill=True, offer=kv).to_json()}
        if isinstance(body.get("prompt"), str):
            # The prefill worker tokenised the prompt already; its ids, from the manifest, spare the decode worker
            # doing it again on its own core with the GIL held (~24 ms per 2,000 words there, a stall of every
            # stream it decodes). The decode worker still checks them against the pages' chain hashes.
            decode_body["prompt"] = list(kv.manifest.prompt_token_ids)
        lease = object()
        self.leases.hold(lease, kv.remote_address, kv.manifest.request_id, kv.lease_seconds)
        self._handing_over[decode_url] = self._handing_over.get(decode_url, 0) + 1
        handed_to = decode_url
        full_until = asyncio.get_running_loop().time() + self.config.handoff_wait
        waited = False
        try:
            attempt = 0
            while attempt < 2:
                request = self.client.build_request("POST", f"{decode_url}{path}", json=decode_body,
                                                    headers=forwarded(deadline))
                try:
                    upstream = await self.client.send(request, stream=True)
                except WORKER_GONE as error:  # not there, or died before answering: the pool's next one, once
                    gone: Exception = error
                    await self._refresh()
                    decode_url = self._pick("decode")
                    attempt += 1
                    continue
                except httpx.HTTPError as error:
                    self.failures.labels("decode").inc()
                    await self._release(prefill_url, kv)
                    return error_response(502, f"decode worker {decode_url} failed: {error!r}", code="decode_failed")
                if upstream.status_code == 200:
                    if not body.get("stream"):
                        try:
                            content = await upstream.aread()
                        finally:  # cancelled mid-read: the connection closes, the decode worker aborts
                            await upstream.aclose()
                        return Response(content, 200, media_type=upstream.headers.get("content-type"))
                    return StreamingResponse(self._relay(upstream, decode_url), media_type="text/event-stream")
                content = await upstream.aread()
                await upstream.aclose()
                code = _error_code(content)
                if upstream.status_code == 503 and code == "kv_pages_gone":
                    raise _PagesGone(_error_code(content, "message") or content.decode(errors="replace"))
                failed_itself = (upstream.status_code == 503 and code in DECODE_GONE_CODES
                                 or upstream.status_code >= 500 and upstream.status_code != 503)
                if failed_itself and attempt == 0:  # shutting down, dying (a 500 as it cancels): the next one
                    gone = RuntimeError(content.decode(errors="replace"))
                    await self._refresh()
                    decode_url = self._pick("decode")
                    attempt += 1
                    continue
                if (upstream.status_code == 503 and code in DECODE_FULL_CODES
                        and asyncio.get_running_loop().time() < full_until):
                    if not waited:
                        waited = True
                        self.handoff_waits.inc()
                    await asyncio.sleep(HANDOFF_RETRY_SECONDS)  # full for now: wait for room, the lease kept
                    decode_url = self._pick("decode")
                    continue
                await self._release(prefill_url, kv)
                if upstream.status_code in (429, 503):
                    return Response(content, upstream.status_code, media_type="application/json",
                                    headers=_retry_after(upstream))
                self.failures.labels("decode").inc()
                if 400 <= upstream.status_code < 500:  # a request its prefill took: the fault is not the client's
                    return error_response(502, f"decode worker {decode_url} refused a prefilled request: "
                                               f"{content.decode(errors='replace')[:500]}", code="decode_failed")
                return error_response(503, f"decode worker {decode_url} failed ({upstream.status_code}): "
                                           f"{content.decode(errors='replace')[:500]}", code="decode_failed",
                                      headers={"Retry-After": RETRY_AFTER_SECONDS})
            self.failures.labels("connect").inc()
            await self._release(prefill_url, kv)
            return error_response(503, f"no decode worker could take the request: {gone!r}",
                                  code="worker_unreachable", headers={"Retry-After": RETRY_AFTER_SECONDS})
        except asyncio.CancelledError:
            await self._release(prefill_url, kv)
            raise
        finally:
            self.leases.let_go(lease)
            self._handing_over[handed_to] -= 1

    async def _where_to_prefill(self, body: dict, decode_url: str, prefill_url: str) -> str | Response:
        """"remote" if the prompt's uncached part is worth a prefill worker, else "local"; or a 503 if the decode
        worker takes no more remote KV now (its queue of requests waiting for room is full): refused before a
        prefill is spent on it. The decode worker is asked what its prefix cache holds (POST /v1/kv/lookup): a
        repeated prompt, or one whose new part is short, is prefilled there -- only its uncached part -- and moves
        no KV at all. The prefill worker tokenises the prompt for that question (POST /tokenize): on the decode
        worker it would run on the core that steps every stream, in pure Python with the GIL held (~24 ms per
        2,000 words warm, ~170 ms the first time), a stall of all of them."""
        if body.get("n", 1) != 1 or body.get("echo") or (body.get("max_tokens") == 1):
            return "local"
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return "local"  # several prompts in one request
        try:
            if isinstance(prompt, list):
                ids = prompt  # token ids already
            else:
                ask = {"messages": body["messages"]} if "messages" in body else {"prompt": prompt}
                for key in ("add_generation_prompt", "split_special_tokens", "tools", "tool_choice",
                            "parallel_tool_calls"):  # tokenized as the request will be
                    if key in body:
                        ask[key] = body[key]
                tokenized = await self.client.post(f"{prefill_url}/tokenize", json=ask)
                if tokenized.status_code != 200:
                    return "local"  # let the decode worker answer whatever is wrong with it
                ids = list(TokenizeAnswer.from_json(tokenized.json()).tokens)
            ask_held = KVLookupRequest(prompt=ids).model_dump(exclude_unset=True)  # {"prompt": ids}
            answer = await self.client.post(f"{decode_url}/v1/kv/lookup", json=ask_held)
            if answer.status_code != 200:
                return "local"  # let the decode worker answer whatever is wrong with it
            held = KVLookupAnswer.from_json(answer.json())
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 1
            if held.max_model_len and held.prompt_tokens + int(max_tokens) > held.max_model_len:
                return "local"  # longer than the decode worker can hold: it says so itself (its 400), no prefill spent
        except WORKER_GONE:
            raise  # looked for again
        except (httpx.HTTPError, MalformedMessage, TypeError, ValueError):
            return "local"  # let the decode worker answer whatever is wrong with it
        if held.uncached_tokens < self.config.local_prefill_tokens:
            return "local"
        # Its queue as it says, or as this front knows it (prefilled for it and not yet started there: a superset
        # of this front's share of that queue, and ahead of it)
        waiting = max(held.kv_waiting, self._handing_over.get(decode_url, 0))
        if not held.accepting or waiting >= held.max_kv_waiting:
            return error_response(503, f"the decode worker has {waiting} requests waiting for KV room (at most "
                                       f"{held.max_kv_waiting}); retry later", code="decode_busy",
                                  headers={"Retry-After": RETRY_AFTER_SECONDS})
        return "remote"

    def _release_soon(self, prefill_url: str, name: str) -> None:
        """Release a request's pages by the name this front gave it, without waiting for the answer (whoever cancelled
        is not held up); close() waits for releases still on their way."""
        task = asyncio.ensure_future(self._release_by_name(prefill_url, name))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_by_name(self, prefill_url: str, name: str) -> None:
        try:
            await self.client.post(f"{prefill_url}/v1/kv/release", json=KVRelease(name).to_json(), timeout=5.0)
            self.released.inc()
        except httpx.HTTPError:
            logger.warning("could not release KV at %s; its lease will", prefill_url)

    async def close(self) -> None:
        if self._releasing:
            await asyncio.wait(set(self._releasing), timeout=5.0)
        await self.client.aclose()
        self.leases.close()

    async def _release(self, prefill_url: str, kv: KVOffer) -> None:
        try:
            await self.client.post(f"{prefill_url}/v1/kv/release", json=KVRelease(kv.manifest.request_id).to_json())
        except httpx.HTTPError:
            logger.warning("could not release KV at %s; its lease will", prefill_url)

    async def _forward(self, url: str, path: str, body: dict, deadline: Deadline | None) -> Response:
        """The whole request to a decode worker, which prefills it itself."""
        request = self.client.build_request("POST", f"{url}{path}", json=body, headers=forwarded(deadline))
        try:
            upstream = await self.client.send(request, stream=True)
        except WORKER_GONE:
            raise  # looked for again
        except httpx.HTTPError as error:
            self.failures.labels("decode").inc()
            return error_response(502, f"decode worker {url} failed: {error!r}", code="decode_failed")
        if not body.get("stream") or upstream.status_code != 200:
            try:
                content = await upstream.aread()
            finally:  # cancelled mid-read: the connection closes, the decode worker aborts
                await upstream.aclose()
            return Response(content, upstream.status_code, media_type=upstream.headers.get("content-type"),
                            headers=_retry_after(upstream))
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


def _retry_after(upstream: httpx.Response) -> dict[str, str] | None:
    value = upstream.headers.get("retry-after")
    return {"Retry-After": value} if value else None


def create_front_app(config: FrontConfig, pool=None) -> FastAPI:
    front = DisaggregatedFront(config, pool)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await front.close()  # releases still on their way go out first

    app = FastAPI(title="ridgeline disaggregated front", lifespan=lifespan)
    # SIGTERM (server/launcher.py): past the grace, what is still in flight gets this front's own 503 / error event,
    # and its upstream requests are cancelled (server/drain.py)
    drain = Drain()
    app.add_middleware(DrainGate, drain=drain)
    app.state.begin_shutdown = drain.begin
    app.state.drain = drain

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
