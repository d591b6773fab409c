"""Any OpenAI-compatible server (llama.cpp's llama-server, vLLM, another ridgeline) as a replica: the request
body goes through as the client sent it, with the model renamed to what that server calls it.

A connection that fails is a dead replica; 429 and 503 are a busy one (skipped for its Retry-After: another
replica is tried, and if none takes the request the client gets that 429/503, its body and a Retry-After); a
request that could not be sent (no connection) goes to another replica; one the server had and dropped before
answering (a non-streaming request's answer comes whole at its end) is not re-run: the client gets a 502; a
stream cut mid-way ends with an explicit error event, never a hang. A disaggregated front (`ridgeline proxy`, or
`serve --prefill-workers`) refuses so when its decode side is full, before it spends a prefill.
"""

from collections.abc import AsyncIterator

import httpx

from ridgeline.cluster.errors import ReplicaBusy, ReplicaFailed, ReplicaUnavailable
from ridgeline.cluster.health import parse_retry_after
from ridgeline.cluster.replicas import Replica


# Failures that leave the request surely not started on the server, so another replica may run it: no connection,
# or the body not wholly written (a server acts on no request it has not read to its end). A read error, a
# connection closed with no answer, is not among them: the server had the request and may have been generating.
UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError, httpx.WriteTimeout,
          httpx.UnsupportedProtocol, httpx.ProxyError)


class HttpReplica(Replica):
    kind = "openai"

    def __init__(self, name: str, model: str, url: str, served_name: str | None = None, api_key: str | None = None,
                 probe_timeout_s: float = 5.0, connect_timeout_s: float = 5.0):
        super().__init__(name, model)
        self.url = url.rstrip("/")
        self.served_name = served_name or model
        self.probe_timeout_s = probe_timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No read timeout: a long generation is not a failure; a dead server is found by the health checks and
        # by the connection breaking. No cap on connections: one per request in flight (httpx's default of 100
        # queued the rest here, unseen by the replica's own admission and backpressure).
        self.client = httpx.AsyncClient(base_url=self.url, headers=headers,
                                        timeout=httpx.Timeout(None, connect=connect_timeout_s),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))

    async def probe(self) -> None:
        for path in ("/health", "/v1/models"):
            try:
                response = await self.client.get(path, timeout=self.probe_timeout_s)
            except httpx.HTTPError as error:
                raise ReplicaFailed(f"{self.name}: health check failed: {type(error).__name__}: {error}") from None
            if response.status_code in (429, 503):
                raise ReplicaBusy(f"{self.name}: busy ({response.status_code})",
                                  parse_retry_after(response.headers.get("retry-after")))
            if response.status_code < 400:
                return None
        raise ReplicaFailed(f"{self.name}: health check answered {response.status_code}")

    async def open(self, path: str, body: dict, headers: dict[str, str] | None = None) -> httpx.Response:
        """Send the request; the response is open for streaming (the caller closes it). Raises ReplicaBusy on
        429/503 and ReplicaUnavailable when the server cannot be reached (nothing was done: try elsewhere);
        ReplicaFailed when it had the request and the connection closed before an answer (do not re-run it)."""
        request = self.client.build_request("POST", path, json={**body, "model": self.served_name}, headers=headers)
        try:
            response = await self.client.send(request, stream=True)
        except UNSENT as error:
            raise ReplicaUnavailable(f"{self.name}: cannot reach {self.url}: {type(error).__name__}: {error}") from None
        except httpx.HTTPError as error:
            # The whole request went out and no answer came back: the server may have started it (a non-streaming
            # answer's headers come only with its end), so it is not sent again elsewhere.
            raise ReplicaFailed(f"{self.name}: lost after the request was sent; it may have run there, so it is not "
                                f"re-sent: {type(error).__name__}: {error}") from None
        if response.status_code in (429, 503):
            try:
                content = await response.aread()  # the backend's reason (a disaggregated front's decode_busy, ...)
            except httpx.HTTPError:
                content = None
            finally:
                await response.aclose()
            raise ReplicaBusy(f"{self.name}: answered {response.status_code}",
                              parse_retry_after(response.headers.get("retry-after")), response.status_code, content)
        return response

    async def relay(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The response body as it arrives; ReplicaFailed if the connection breaks part-way."""
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError as error:
            raise ReplicaFailed(f"{self.name}: connection lost mid-response: {type(error).__name__}") from None
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self.client.aclose()
