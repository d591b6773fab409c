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
work) rather than a request count. Prompts no replica holds pay no copy charge, so traffic without shared
prefixes (uniform load, a burst) is placed by counted load, less only what it would evict (below).

A prefix no replica holds is charged likewise for what it evicts (its `evict_s`): its blocks past the room left in
a replica's cache (the blocks the router knows it holds, reported or sent, against what the cache can hold), at
the same COPY_PENALTY. Without it, the placement of a new system prompt was decided by whatever the counted load
differed by at that moment - one more stream decoding, 15 tokens of backlog, a few milliseconds - so a replica
already holding four prefixes got a fifth while the other had room for two, evicted from its full cache, and
later turns re-prefilled what it evicted (benchmarks/router_replicas.py, 5 of 8 system prompts on one replica in
a run under CPU stalls: +160 tokens). SGLang's cache-aware router sends a prompt that matches nowhere to the
worker with the smallest tree for the same reason. Only the part nobody holds is charged: copying a held prefix
is `copy_s` already, and a replica with room evicts nothing, so until the caches fill this changes nothing, and
once both are full each is charged the same and counted load decides as before.

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
    evict_s: float = 0.0  # charge for the blocks nobody holds that this replica's full cache would evict for them

    @property
    def score(self) -> float:
        return self.cost.total_s + self.copy_s + self.evict_s


def rank_replicas(replicas: list[str], prompt_tokens: int, output_tokens: int, cached_tokens: dict[str, int],
                  index: PrefixIndex, loads: LoadTracker, rates: dict[str, Rates],
                  caches: dict[str, tuple[int, int]] | None = None) -> list[ReplicaChoice]:
    """Usable replicas, best first. cached_tokens: the prompt tokens each replica holds (PrefixIndex.match);
    caches: (block size, prompt blocks its cache holds) of each replica that says (absent: no eviction charge)."""
    held_anywhere = max((cached_tokens.get(name, 0) for name in replicas), default=0)
    choices = []
    for name in replicas:
        cached = cached_tokens.get(name, 0)
        load = loads.of(name)
        cost = predict(rates[name], load, prompt_tokens, cached, output_tokens)
        copy_s = COPY_PENALTY * (held_anywhere - cached) / rates[name].prefill_tokens_per_s
        evict_s = 0.0
        if caches and name in caches:
            block_size, capacity = caches[name]
            stored = (prompt_tokens - 1) // block_size  # the full blocks the prompt leaves in the cache
            fresh = stored - held_anywhere // block_size  # of them, those no replica holds
            over = index.blocks_in_use(name) + stored - cached // block_size - capacity
            evict_s = COPY_PENALTY * max(0, min(fresh, over)) * block_size / rates[name].prefill_tokens_per_s
        choice = ReplicaChoice(name, cached, cost, copy_s, evict_s)
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
