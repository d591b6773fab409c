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
    """Alive but refusing work for now (429/503, at capacity): skipped until its Retry-After has passed."""

    code = "backend_busy"


class ReplicaFailed(ReplicaError):
    """Died or broke while the request was in flight: the request fails, explicitly."""

    status = 502
    code = "backend_failed"


class ReplicaRejected(ReplicaError):
    """The request itself is at fault (e.g. too long for the model): no other replica would take it either."""

    status = 400
    code = "invalid_request"


class NoReplicaAvailable(ReplicaError):
    status = 503
    code = "no_backend_available"
