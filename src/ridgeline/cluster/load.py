"""Load counted at dispatch: a replica's load rises the moment a request is sent to it, not when the replica
gets round to reporting it. Routers that count late send a whole burst to the replica that looked idle.

Per replica: requests in flight, and prompt tokens sent but not yet prefilled (each request's estimate is
dropped when its first token arrives, and everything on finish, error or cancel). Each worker report corrects
the estimate: its real backlog of uncomputed prompt tokens covers the first `received` requests it was sent, so
the router adds only its own estimates for requests sent after that.
"""

from dataclasses import dataclass, field


@dataclass
class _Dispatch:
    ordinal: int  # this replica's count of requests sent, when this one was sent
    prefill_tokens: int  # expected uncached prompt tokens
    prefilled: bool = False


@dataclass
class ReplicaLoad:
    sent: int = 0
    reported_backlog: int | None = None  # tokens, as of the worker's last report (None: never reported)
    reported_received: int = 0
    in_flight: dict[str, _Dispatch] = field(default_factory=dict)
    # Running totals over in_flight, kept as requests come and go (the router reads them for every decision).
    num_decoding: int = 0
    counted_prefill_tokens: int = 0  # expected tokens of requests not yet past their first token

    @property
    def num_in_flight(self) -> int:
        return len(self.in_flight)

    @property
    def prefill_backlog(self) -> int:
        """Prompt tokens waiting to be prefilled on this replica, as best the router knows now."""
        if self.reported_backlog is None:
            return self.counted_prefill_tokens
        unseen = 0
        if self.sent > self.reported_received:  # only requests sent after the report add to it
            unseen = sum(d.prefill_tokens for d in self.in_flight.values()
                         if not d.prefilled and d.ordinal > self.reported_received)
        return self.reported_backlog + unseen


class LoadTracker:
    def __init__(self) -> None:
        self.replicas: dict[str, ReplicaLoad] = {}

    def of(self, replica: str) -> ReplicaLoad:
        return self.replicas.setdefault(replica, ReplicaLoad())

    def dispatched(self, replica: str, request_id: str, prefill_tokens: int) -> None:
        load = self.of(replica)
        load.sent += 1
        load.in_flight[request_id] = _Dispatch(load.sent, prefill_tokens)
        load.counted_prefill_tokens += prefill_tokens

    def first_token(self, replica: str, request_id: str) -> None:
        load = self.of(replica)
        dispatch = load.in_flight.get(request_id)
        if dispatch is not None and not dispatch.prefilled:
            dispatch.prefilled = True
            load.num_decoding += 1
            load.counted_prefill_tokens -= dispatch.prefill_tokens

    def done(self, replica: str, request_id: str) -> None:
        """Finished, failed or cancelled: the request no longer loads the replica."""
        load = self.of(replica)
        dispatch = load.in_flight.pop(request_id, None)
        if dispatch is not None:
            if dispatch.prefilled:
                load.num_decoding -= 1
            else:
                load.counted_prefill_tokens -= dispatch.prefill_tokens

    def report(self, replica: str, received: int, queued_prefill_tokens: int) -> None:
        load = self.of(replica)
        load.reported_received = received
        load.reported_backlog = queued_prefill_tokens

    def forget_reports(self, replica: str) -> None:
        """A replica that restarted: its old report says nothing about the new one."""
        load = self.of(replica)
        load.reported_backlog, load.reported_received, load.sent = None, 0, 0
