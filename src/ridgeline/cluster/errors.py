"""Why a request could not be served by a replica: each carries the HTTP status a front should answer with."""

from ridgeline.errors import RidgelineError


class ReplicaError(RidgelineError):
    status = 502
    code = "backend_error"

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ReplicaUnavailable(ReplicaError):
    """Refused before any work started (dead, unreachable, 429/503): the router may try another replica."""

    status = 503
    code = "backend_unavailable"


class ReplicaBusy(ReplicaUnavailable):
    """Alive but refusing work for now (429/503, at capacity): skipped until its Retry-After has passed.
    `status` and `body`: the backend's own answer (an OpenAI server's 429 or 503 and its error JSON), passed on to
    the client when no other replica takes the request."""

    code = "backend_busy"

    def __init__(self, message: str, retry_after: float | None = None, status: int = 503, body: bytes | None = None):
        super().__init__(message, retry_after)
        self.status = status if status in (429, 503) else 503
        self.body = body


class ReplicaFailed(ReplicaError):
    """Died or broke while the request was in flight: the request fails, explicitly."""

    status = 502
    code = "backend_failed"


class ReplicaRejected(ReplicaError):
    """The request itself is at fault (e.g. too long for the model): no other replica would take it either."""

    status = 400
    code = "invalid_request"


class NoReplicaAvailable(ReplicaError):
    """No replica took the request, none having started it: a 503 (or the busy backend's own 429/503) with
    Retry-After, never a 4xx or a 502 (the request was not at fault, and may be sent again as it was).
    `busy`: the busy refusal to pass on (the soonest to end), if a backend refused it so."""

    status = 503
    code = "no_backend_available"

    def __init__(self, message: str, retry_after: float | None = None, busy: ReplicaBusy | None = None):
        super().__init__(message, retry_after)
        self.busy = busy
        if busy is not None:
            self.status = busy.status
