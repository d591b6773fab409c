"""Which replica of a model takes a request: the one with the least predicted cost, where the cost counts both
the prompt blocks the replica already holds (prefix affinity shortens prefill) and the load counted at dispatch
(queue wait, decode batch). A cached prefix wins only while it saves more than the extra queue costs.
Equal costs go to the replica with the fewest requests in flight, then the one holding the fewest cached blocks
(a new prefix goes where it evicts least), then the fewest sent, so identical traffic is spread evenly even
before any report arrives. `round_robin` is the baseline the benchmarks compare against."""

import itertools

from dataclasses import dataclass

from ridgeline.cluster.affinity import PrefixIndex
from ridgeline.cluster.cost import Cost, predict
from ridgeline.cluster.load import LoadTracker
from ridgeline.cluster.rates import Rates


@dataclass(frozen=True)
class ReplicaChoice:
    replica: str
    cached_tokens: int
    cost: Cost


def rank_replicas(replicas: list[str], prompt_tokens: int, output_tokens: int, cached_tokens: dict[str, int],
                  index: PrefixIndex, loads: LoadTracker, rates: dict[str, Rates]) -> list[ReplicaChoice]:
    """Usable replicas, best first. cached_tokens: the prompt tokens each replica holds (PrefixIndex.match)."""
    choices = []
    for name in replicas:
        cached = cached_tokens.get(name, 0)
        load = loads.of(name)
        cost = predict(rates[name], load, prompt_tokens, cached, output_tokens)
        choices.append((ReplicaChoice(name, cached, cost),
                        (round(cost.total_s, 9), load.num_in_flight, index.num_blocks(name), load.sent, name)))
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
