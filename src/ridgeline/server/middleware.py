"""Request gates that run before any body is parsed: the API key or tenant key (401) and the body size limit (413).

Plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, which would buffer streamed responses
and hide client disconnects from the handlers.
"""

import hmac
import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ridgeline.server.dashboard import OPEN_DASHBOARD_PATHS
from ridgeline.server.errors import error_body
from ridgeline.tenancy.gate import TenantGate

# Paths a load balancer or Prometheus may reach without the key (as vLLM does), and the dashboard's page and
# assets: code only, whose data requests carry the key (server/dashboard.py).
OPEN_PATHS = frozenset({"/health", "/metrics"}) | OPEN_DASHBOARD_PATHS


async def _send_error(send: Send, status: int, message: str, code: str | None = None, extra_headers=()) -> None:
    body = json.dumps(error_body(status, message, code=code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """Requires `Authorization: Bearer <key>` on every path but the open ones: the one --api-key, or with a
    tenants gate (tenancy/gate.py) any tenant's key, whose tenant it leaves in the request's state."""

    def __init__(self, app: ASGIApp, api_key: str | None = None, tenants: "TenantGate | None" = None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.tenants = tenants

    def _allowed(self, scope: Scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        if self.tenants is None:
            return hmac.compare_digest(given, self.expected)
        tenant = self.tenants.authenticate(given)
        if tenant is not None:
            scope.setdefault("state", {})["tenant"] = tenant
        return tenant is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            if not self._allowed(scope):
                await _send_error(
                    send, 401, "missing or wrong API key", "invalid_api_key", [(b"www-authenticate", b"Bearer")]
                )
                return
        await self.app(scope, receive, send)


class BodyTooLarge(HTTPException):
    """Raised from inside the body read; an HTTPException so that FastAPI lets it through unchanged."""

    def __init__(self, max_bytes: int):
        super().__init__(413, f"request body is larger than {max_bytes} bytes")


class BodySizeLimitMiddleware:
    """413 for a body over max_bytes, by its Content-Length or, for a chunked body, as it arrives."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)  # the app's HTTPException handler answers it
            return message

        await self.app(scope, counting_receive, send)

    async def _too_large(self, send: Send) -> None:
        await _send_error(send, 413, f"request body is larger than {self.max_bytes} bytes")


class ApiServerHeaderMiddleware:
    """With several API processes (`serve --api-server-count N`), every response says which one answered
    (`X-Ridgeline-Api-Server: INDEX`): the kernel spreads connections over them, and a client, a test or an
    operator reading /metrics needs to know whose counters it got."""

    def __init__(self, app: ASGIApp, index: int):
        self.app = app
        self.header = (b"x-ridgeline-api-server", str(index).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, tagged)
