"""Load counted at dispatch: a replica's load rises the moment a request is sent to it and falls the moment the
router sees it progress, not when the replica gets round to reporting it. Routers that count late send a whole
burst to the replica that looked idle; routers that trust a periodic snapshot keep counting work that finished
since (a backlog reported once per health check, 1 s by default, is mostly gone by the time it is read).

Per replica: requests in flight, and for each the prompt tokens it still has to prefill. A request's count starts
at what it is expected to prefill (its prompt less the prefix the router knows the replica holds), drops to zero
when its first token arrives, and goes on finish, error or cancel: exact at every dispatch without any polling.
Worker reports only correct it: each names, per request in flight, the prompt tokens it really has left (less what
its prefix cache holds, which the router may not have known of, or more, if a block it counted on was evicted),
and the router takes that figure for the request until the next report or its first token. A request a report
does not name (not yet arrived there, or already past its prefill) keeps the router's own count.
"""

from dataclasses import dataclass, field


@dataclass
class _Dispatch:
    ordinal: int  # this replica's count of requests sent, when this one was sent
    prefill_tokens: int  # uncached prompt tokens still to prefill, as best the router knows
    prefilled: bool = False


@dataclass
class ReplicaLoad:
    sent: int = 0
    in_flight: dict[str, _Dispatch] = field(default_factory=dict)
    # Running totals over in_flight, kept as requests come and go (the router reads them for every decision).
    num_decoding: int = 0
    counted_prefill_tokens: int = 0  # tokens of requests not yet past their first token
    reports: int = 0  # worker reports applied

    @property
    def num_in_flight(self) -> int:
        return len(self.in_flight)

    @property
    def prefill_backlog(self) -> int:
        """Prompt tokens waiting to be prefilled on this replica, as best the router knows now."""
        return self.counted_prefill_tokens


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

    def report(self, replica: str, prefill_remaining: dict[str, int | None] | None) -> None:
        """A worker's word on what its requests in flight still have to prefill (None for one it has not looked
        at yet); the router's count of each request it names becomes that."""
        if not prefill_remaining:
            return
        load = self.of(replica)
        load.reports += 1
        for request_id, left in prefill_remaining.items():
            dispatch = load.in_flight.get(request_id)
            if left is None or dispatch is None or dispatch.prefilled:
                continue
            load.counted_prefill_tokens += left - dispatch.prefill_tokens
            dispatch.prefill_tokens = left
