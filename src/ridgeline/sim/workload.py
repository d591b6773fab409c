"""What the simulator serves: requests (prompt token ids, output length) and when they may be sent.

Mirrors `bench serve`: Poisson arrivals (the same seeded generator, so one seed gives the same arrival times),
a fixed concurrency (every request ready at once, at most N in flight), or a trace; with a trace or a rate,
a concurrency cap may also hold requests back until a slot frees. Prompt ids matter: requests that share a
prefix hit the prefix cache exactly as they would in the engine.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass

from ridgeline.errors import RidgelineError
from ridgeline.workload.trace import TraceRequest

# Ids drawn for synthetic prompts stay clear of the low ids where tokenizers keep their special tokens.
FIRST_PLAIN_ID = 1000


@dataclass(frozen=True)
class SimRequest:
    prompt_ids: tuple[int, ...]
    output_tokens: int
    arrival_s: float  # earliest send time; with a concurrency cap it is sent when a slot frees


@dataclass(frozen=True)
class Workload:
    requests: list[SimRequest]  # in arrival order
    concurrency: int | None = None  # at most this many in flight (None: no cap)
    label: str = ""
    rate: float | None = None  # Poisson requests/s, for a synthetic open-loop workload


def random_ids(rng: random.Random, count: int, vocab_size: int) -> tuple[int, ...]:
    low = FIRST_PLAIN_ID if vocab_size > 2 * FIRST_PLAIN_ID else 0
    return tuple(rng.choices(range(low, vocab_size), k=count))


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """bench serve's arrival times: the first at 0, then exponential gaps drawn from Random(seed)."""
    if rate <= 0:
        raise RidgelineError(f"request rate must be positive, got {rate}")
    rng, clock, times = random.Random(seed), 0.0, []
    for _ in range(count):
        times.append(clock)
        clock += rng.expovariate(rate)
    return times


def synthetic(count: int, input_len: int, output_len: int, vocab_size: int, *, rate: float | None = None,
              concurrency: int | None = None, shared_prefix_len: int = 0, seed: int = 0) -> Workload:
    """`count` prompts of `input_len` ids (the first `shared_prefix_len` common to all) and `output_len` tokens."""
    if count < 1 or input_len < 1 or output_len < 1:
        raise RidgelineError(f"need at least one request of at least one prompt and one output token, got "
                             f"{count} requests of {input_len} + {output_len} tokens")
    if not 0 <= shared_prefix_len <= input_len:
        raise RidgelineError(f"shared prefix ({shared_prefix_len}) must lie within the prompt ({input_len} tokens)")
    if rate is None and concurrency is None:
        raise RidgelineError("give a request rate, a concurrency, or both")
    rng = random.Random(seed + 1)  # not the arrivals' generator: changing lengths must not move arrivals
    prefix = random_ids(rng, shared_prefix_len, vocab_size)
    arrivals = poisson_arrivals(rate, count, seed) if rate is not None else [0.0] * count
    requests = [SimRequest(prefix + random_ids(rng, input_len - shared_prefix_len, vocab_size), output_len, t)
                for t in arrivals]
    label = f"rate {rate:g}/s" if rate is not None else f"concurrency {concurrency}"
    if rate is not None and concurrency is not None:
        label += f", max {concurrency} in flight"
    return Workload(requests, concurrency, label, rate)


def from_trace(rows: list[TraceRequest], vocab_size: int, tokenize: Callable[[str], list[int]] | None = None,
               concurrency: int | None = None, seed: int = 0, label: str = "trace") -> Workload:
    """A trace's requests: its ids as given, text through `tokenize` when there is one, else a count of fresh
    random ids (such prompts share nothing, so they never hit the prefix cache)."""
    rng = random.Random(seed)
    requests = []
    for number, row in enumerate(rows, 1):
        if row.prompt_ids is not None:
            ids = row.prompt_ids
        elif row.prompt is not None and tokenize is not None:
            ids = tuple(tokenize(row.prompt))
        elif row.prompt_tokens is not None:
            ids = random_ids(rng, row.prompt_tokens, vocab_size)
        else:
            raise RidgelineError(f"trace request {number} gives its prompt as text only: the simulator needs "
                                 f"'prompt_ids' or 'prompt_tokens' (or a model file whose tokenizer reads the text)")
        if any(i >= vocab_size for i in ids):
            raise RidgelineError(f"trace request {number} has token ids outside the model's vocabulary "
                                 f"(0..{vocab_size - 1})")
        requests.append(SimRequest(tuple(ids), row.output_tokens, row.arrival_s))
    return Workload(requests, concurrency, label + (f", max {concurrency} in flight" if concurrency else ""))
