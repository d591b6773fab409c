"""Routers over tiny random-weight engines (tests/server_helpers.py's model), built straight from replicas."""

import itertools

from ridgeline.cluster.local_replica import LocalReplica
from ridgeline.cluster.messages import GenerateRequest
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.engine.sampling_params import SamplingParams
from server_helpers import tiny_engine

# Fixed rates so that costs (and so decisions) do not depend on this machine's speed.
TEST_RATES = (2000.0, 100.0)
_ids = itertools.count()


def local_group(name: str, replicas: int = 2, quality: float = 0.5, num_blocks: int = 256,
                max_num_seqs: int = 64) -> ModelGroup:
    made = [LocalReplica(f"{name}/{i}", name, lambda: tiny_engine(max_num_seqs, num_blocks)) for i in range(replicas)]
    return ModelGroup(name, quality, made, tokenizer=made[0].tokenizer, admission=made[0].admission)


def make_router(groups: list[ModelGroup], policy: str = "cost", **options) -> Router:
    rates = {r.name: Rates(*TEST_RATES, "configured") for g in groups for r in g.replicas}
    return Router(groups, rates, policy=policy, health_interval_s=3600, **options)


def request(prompt: list[int], max_tokens: int = 4) -> GenerateRequest:
    return GenerateRequest(f"req-{next(_ids)}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                       ignore_eos=True))


async def run_one(router: Router, model: str, prompt: list[int], max_tokens: int = 4):
    """The final output of one request routed to `model`."""
    last = None
    async for output in router.generate(model, request(prompt, max_tokens)):
        last = output
    return last
