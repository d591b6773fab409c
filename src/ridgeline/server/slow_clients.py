"""A deadline for reading each request, so that slow or idle clients (slowloris) cannot hold connections forever.

uvicorn's h11 protocol times out idle keep-alive connections only after a response, and any byte received
resets that timer: a client that opens a connection and sends one header byte every few seconds keeps it,
and a few thousand such clients hold a few thousand sockets and tasks. Here every request gets
`read_seconds` from the moment the connection may carry it (opened, or the previous response finished) to
its last body byte; a connection still reading by then is closed. Requests being answered (a long stream
included) are not affected.
"""

from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_READ_SECONDS = 20.0  # nginx allows 60 s for headers and 60 s between body reads; a JSON body needs less


class ReadDeadlineProtocol(H11Protocol):
    read_seconds = REQUEST_READ_SECONDS
    _deadline = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        waiting_after = self.cycle  # a new request replaces the cycle; until then we are reading its head

        def expire() -> None:
            reading_head = self.cycle is waiting_after
            reading_body = self.cycle is not None and self.cycle.more_body and not self.cycle.response_started
            if (reading_head or reading_body) and not self.transport.is_closing():
                self.transport.close()

        self._deadline = self.loop.call_later(self.read_seconds, expire)


def protocol_with_deadline(read_seconds: float) -> type[H11Protocol]:
    return type("ReadDeadlineProtocol", (ReadDeadlineProtocol,), {"read_seconds": read_seconds})
