"""A proxy's graceful shutdown (`ridgeline proxy`, `ridgeline router`): past the grace, what is still in flight gets
this process's own explicit error, not a cut connection (issue 38).

A one-model server drains its engine (server/async_engine.py). A proxy has no engine: its answers come from
workers behind it, which may be busy for minutes, or be shutting down themselves, or be fine and simply slow. So
the proxy does not rely on them to end what it relays: on the first SIGTERM (server/launcher.py's GracefulServer
calls `begin(grace)`) it answers new requests on still-open connections with 503 shutting_down, and `grace` seconds
later every request still in flight is ended here -- a 503 shutting_down with Retry-After if its answer has not
started, an error event and `data: [DONE]` if it is a stream that has -- and its handler is cancelled, which
closes its upstream connections: the workers behind abort it and free its pages (and a disaggregated front
releases what a prefill worker holds for it).

Plain ASGI, outermost but for the API key: it sees every request's first and last message.
"""

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ridgeline.server.errors import error_body

SHUTDOWN_MESSAGE = "server shut down before the request finished"
RETRY_AFTER = b"1"
CLEANUP_SECONDS = 1.0  # a cancelled handler's cleanup waited for (less than the launcher's FLUSH_SECONDS)


def _json_error(message: str) -> bytes:
    return json.dumps(error_body(503, message, code="shutting_down")).encode()


def _retrieve(handler: asyncio.Future) -> None:
    """A cancelled handler's own error is nobody's to report (its client was told already)."""
    if not handler.cancelled():
        handler.exception()


class _InFlight:
    """One request's response as the app sends it: whether it started, whether it is a stream, whether it ended."""

    def __init__(self, send: Send):
        self._send = send
        self.started = False
        self.stream = False
        self.ended = False
        self.cut = asyncio.Event()  # set past the grace
        self.cutting = False  # from then on the app's own messages are not sent

    async def send(self, message: Message) -> None:
        if self.cutting:
            return  # the app's late words (its cancellation unwinding) after this gate answered
        if message["type"] == "http.response.start":
            self.started = True
            headers = dict(message.get("headers", []))
            self.stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)

    async def tell(self) -> None:
        """End the response here with an explicit error, as far as what was sent already allows."""
        if self.ended:
            return
        if not self.started:
            body = _json_error(SHUTDOWN_MESSAGE)
            await self._send({"type": "http.response.start", "status": 503,
                              "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode()), (b"retry-after", RETRY_AFTER)]})
            await self._send({"type": "http.response.body", "body": body})
        elif self.stream:
            event = json.dumps(error_body(503, SHUTDOWN_MESSAGE, code="shutting_down"))
            await self._send({"type": "http.response.body", "body": f"data: {event}\n\ndata: [DONE]\n\n".encode()})
        else:  # a whole answer whose first bytes are out: its status cannot change; end it (a length mismatch)
            await self._send({"type": "http.response.body", "body": b""})
        self.ended = True


class Drain:
    """The shutdown state one DrainGate reads: `begin(grace)` stops taking requests and ends the ones left after
    `grace` seconds (app.state.begin_shutdown, called by the launcher on SIGTERM)."""

    def __init__(self):
        self.stopping = False
        self.in_flight: set[_InFlight] = set()
        self._cutoff: asyncio.TimerHandle | None = None
        self.num_told = 0  # requests ended here past the grace

    def begin(self, grace: float) -> None:
        """On the event loop. A second call (a second SIGTERM, grace 0) moves the cut-off earlier, never later."""
        self.stopping = True
        loop = asyncio.get_running_loop()
        when = loop.time() + grace
        if self._cutoff is not None:
            if self._cutoff.when() <= when:
                return
            self._cutoff.cancel()
        self._cutoff = loop.call_at(when, self._cut_all)

    def _cut_all(self) -> None:
        for in_flight in list(self.in_flight):
            in_flight.cut.set()


class DrainGate:
    """ASGI middleware over a Drain: 503 shutting_down for what arrives once it stopped, and the explicit end of
    what is left past the grace."""

    def __init__(self, app: ASGIApp, drain: Drain):
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.stopping and scope["path"] not in ("/health", "/metrics"):
            refused = _InFlight(send)
            await refused.tell()
            return
        in_flight = _InFlight(send)
        self.drain.in_flight.add(in_flight)
        handler = asyncio.ensure_future(self.app(scope, receive, in_flight.send))
        cut = asyncio.ensure_future(in_flight.cut.wait())
        try:
            await asyncio.wait({handler, cut}, return_when=asyncio.FIRST_COMPLETED)
            if not handler.done():
                # Past the grace: the client is told, and the handler cancelled (its upstream connections close,
                # the workers abort) and given a moment for its cleanup (a front's releases) to go out.
                in_flight.cutting = True
                handler.cancel()
                self.drain.num_told += 1
                await in_flight.tell()
                await asyncio.wait({handler}, timeout=CLEANUP_SECONDS)
                return
            await handler  # its result, or what it raised
        finally:
            cut.cancel()
            if not handler.done():  # this request's own task cancelled (the server is going): take the handler along
                handler.cancel()
            handler.add_done_callback(_retrieve)
            self.drain.in_flight.discard(in_flight)
