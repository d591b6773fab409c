"""Which replica of a model takes a request: the one with the least predicted cost, where the cost counts both
the prompt blocks the replica already holds (prefix affinity shortens prefill) and the load counted at dispatch
(queue wait, decode batch). A cached prefix wins only while it saves more than the extra queue costs.

Copying a prefix is charged for what it does to the cache, not only to this request. A purely greedy cost (this
request's latency alone) sends a turn away from the replica holding its system prompt whenever that replica's
queue costs about as much as prefilling the prompt again elsewhere - and it often does, because what the holder
is busy with is usually the same prefix's first prefill, which a turn sent to the idle replica repeats in full.
For this one request the two choices are a wash, but the copy lands in a cache that is full in steady state, so
it evicts about as many blocks of other prefixes, which later turns prefill again; and the prefix now lives on
two replicas, so its traffic splits and both keep paying for it. Measured on benchmarks/router_replicas.py (8
shared system prompts, KV for ~4.7 per replica): a third of the avoidable prefill was such copies, and most of
the rest was re-prefill after the evictions they caused. So a replica is charged COPY_PENALTY x the prefill of the
prompt blocks some other usable replica already holds (its `copy_s`): a prefix moves only when the holder's
queue is longer than the alternative's by more than twice the prefill the move repeats - a real imbalance, the
role of SGLang's cache-aware router's balance threshold, but in the router's own units (seconds of predicted
work) rather than a request count. Prompts no replica holds pay no such charge, so traffic without shared
prefixes (uniform load, a burst) is placed by counted load exactly as before.

Equal costs go to the replica with the fewest requests in flight, then the one holding the fewest cached blocks
(a new prefix goes where it evicts least), then the fewest sent, so identical traffic is spread evenly even
before any report arrives. `round_robin` is the baseline the benchmarks compare against."""

import itertools

from dataclasses import dataclass

from ridgeline.cluster.affinity import PrefixIndex
from ridgeline.cluster.cost import Cost, predict
from ridgeline.cluster.load import LoadTracker
from ridgeline.cluster.rates import Rates

# Prompt tokens another replica holds count this many times over on a replica that would copy them: once to
# prefill them (already in `Cost.prefill_s`), COPY_PENALTY more for the blocks the copy evicts from a full cache.
COPY_PENALTY = 1.0


@dataclass(frozen=True)
class ReplicaChoice:
    replica: str
    cached_tokens: int
    cost: Cost  # this request's predicted latency there (what `auto` compares across models)
    copy_s: float = 0.0  # charge for prefilling blocks another replica already holds (see COPY_PENALTY)

    @property
    def score(self) -> float:
        return self.cost.total_s + self.copy_s


def rank_replicas(replicas: list[str], prompt_tokens: int, output_tokens: int, cached_tokens: dict[str, int],
                  index: PrefixIndex, loads: LoadTracker, rates: dict[str, Rates]) -> list[ReplicaChoice]:
    """Usable replicas, best first. cached_tokens: the prompt tokens each replica holds (PrefixIndex.match)."""
    held_anywhere = max((cached_tokens.get(name, 0) for name in replicas), default=0)
    choices = []
    for name in replicas:
        cached = cached_tokens.get(name, 0)
        load = loads.of(name)
        cost = predict(rates[name], load, prompt_tokens, cached, output_tokens)
        copy_s = COPY_PENALTY * (held_anywhere - cached) / rates[name].prefill_tokens_per_s
        choice = ReplicaChoice(name, cached, cost, copy_s)
        choices.append((choice, (round(choice.score, 9), load.num_in_flight, index.num_blocks(name), load.sent, name)))
    choices.sort(key=lambda c: c[1])
    return [choice for choice, _ in choices]


class RoundRobin:
    """Each model's usable replicas in turn, blind to load and cache."""

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count] = {}

    def order(self, model: str, ranked: list[ReplicaChoice]) -> list[ReplicaChoice]:
        if not ranked:
            return ranked
        by_name = sorted(ranked, key=lambda c: c.replica)
        start = next(self._counters.setdefault(model, itertools.count())) % len(by_name)
        return by_name[start:] + by_name[:start]
