"""From a RouterConfig to a running Router: place tiers in the memory budget, start the workers (in process or
as Ray actors), open the OpenAI backends, give every replica its roofline prior, calibrate `auto`."""

import logging
from dataclasses import dataclass

from ridgeline.cluster.config import BackendConfig, RouterConfig, load_sample
from ridgeline.cluster.http_replica import HttpReplica
from ridgeline.cluster.local_replica import LocalReplica
from ridgeline.cluster.placement import Placement, place
from ridgeline.cluster.rates import Rates, roofline_rates
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.errors import RidgelineError
from ridgeline.napkin.hardware import Hardware

logger = logging.getLogger("ridgeline.router")
# Rates for an OpenAI server whose model the router cannot see and the config does not state.
FALLBACK_RATES = Rates(prefill_tokens_per_s=1000.0, decode_tokens_per_s=30.0, source="default")


@dataclass
class BuiltRouter:
    router: Router
    placements: list[Placement]
    hardware: Hardware  # what the placements and roofline rate priors were drawn for (its title: their provenance)


def engine_config_for(config: RouterConfig, backend: BackendConfig):
    from ridgeline.engine.options import engine_config

    return engine_config(config.resolve(backend.path), threads=backend.threads,
                         kv_cache_memory=backend.kv_cache_memory, kv_cache_dtype=backend.kv_cache_dtype,
                         block_size=backend.block_size, max_num_seqs=backend.max_num_seqs,
                         max_num_batched_tokens=backend.max_num_batched_tokens)


def prior_rates(config: RouterConfig, backend: BackendConfig, hardware) -> Rates:
    if backend.prefill_tokens_per_s and backend.decode_tokens_per_s:
        return Rates(backend.prefill_tokens_per_s, backend.decode_tokens_per_s, "configured")
    if backend.kind == "openai":
        return Rates(FALLBACK_RATES.prefill_tokens_per_s, FALLBACK_RATES.decode_tokens_per_s, FALLBACK_RATES.source)
    from ridgeline.model.model_source import load_model_shape

    return roofline_rates(load_model_shape(config.resolve(backend.path)), hardware)


def _replicas(config: RouterConfig, backend: BackendConfig, first_index: int) -> list:
    names = [f"{backend.model}/{first_index + i}" for i in range(backend.replicas)]
    if backend.kind == "openai":
        return [HttpReplica(name, backend.model, backend.url, backend.served_name, backend.api_key,
                            config.router.health_timeout_s) for name in names]
    engine_config = engine_config_for(config, backend)
    if backend.kind == "ray":
        from ridgeline.cluster.ray_replica import RayReplica
        from ridgeline.cluster.ray_worker import ensure_ray

        ensure_ray(config.router.ray_address)
        return [RayReplica(name, backend.model, engine_config, backend.num_cpus, config.router.health_timeout_s)
                for name in names]
    from ridgeline.engine.llm_engine import LLMEngine

    return [LocalReplica(name, backend.model, lambda: LLMEngine(engine_config)) for name in names]


async def build_router(config: RouterConfig, memory_budget: float | None = None, hardware=None) -> BuiltRouter:
    if hardware is None:
        # Read, never measured at start-up: this machine's cached entry, else its napkin estimate titled NOT MEASURED
        from ridgeline.machine.this_machine import roof_named

        hardware = roof_named(config.router.hardware)
    logger.info("placement and rate priors drawn for %s", hardware.title)
    budget = memory_budget
    if budget is None and config.router.memory:
        from ridgeline.engine.options import parse_bytes

        budget = parse_bytes(config.router.memory)
    placements = place(config, budget, hardware)
    for placement in placements:
        logger.info("%s (%s): %s", placement.backend.model, placement.backend.kind, placement.reason)
    kept = [p.backend for p in placements if p.loaded]
    if not kept:
        raise RidgelineError("no backend fits the memory budget: " + "; ".join(
            f"{p.backend.model}: {p.reason}" for p in placements))

    groups: dict[str, ModelGroup] = {}
    rates: dict[str, Rates] = {}
    prices: dict[str, float] = {}
    for backend in kept:
        group = groups.get(backend.model)
        replicas = _replicas(config, backend, len(group.replicas) if group else 0)
        prior = prior_rates(config, backend, hardware)
        for replica in replicas:
            rates[replica.name] = Rates(prior.prefill_tokens_per_s, prior.decode_tokens_per_s, prior.source)
            if backend.usd_per_hour is not None:
                prices[replica.name] = backend.usd_per_hour
        if group is None:
            group = groups[backend.model] = ModelGroup(backend.model, backend.quality, [],
                                                       chars_per_token=backend.chars_per_token)
        group.replicas.extend(replicas)
        if backend.kind == "ray":
            for replica in replicas:
                await replica.ready()
        if backend.kind != "openai" and group.tokenizer is None:
            from ridgeline.engine.admission import Admission
            from ridgeline.engine.structured.compiler import GrammarCompiler

            group.tokenizer = (replicas[0].tokenizer if backend.kind == "engine"
                               else _load_tokenizer(config.resolve(backend.path)))
            # The tightest replica's limits: a request any replica might get must fit every one.
            limits = min((r.info.limits for r in replicas), key=lambda limits: limits.max_seq_len)
            group.admission = Admission(limits, group.tokenizer, GrammarCompiler(group.tokenizer, limits.vocab_size))

    s = config.router
    router = Router(list(groups.values()), rates, s.threshold, s.expected_output_tokens, s.health_interval_s,
                    policy=s.policy, prices=prices, objective=s.objective,
                    slo_ttft_s=s.slo_ttft_ms / 1000 if s.slo_ttft_ms is not None else None,
                    slo_itl_s=s.slo_itl_ms / 1000 if s.slo_itl_ms is not None else None)
    await router.start()
    if s.target_large_share is not None:
        if not s.calibration_sample:
            raise RidgelineError("[router] target_large_share needs a calibration_sample")
        # counted and scanned as `auto` counts and scans a request (server/router_app.py)
        sample = [(router.count_prompt_tokens(sample_text(item)), question_text(item))
                  for item in load_sample(config.resolve(s.calibration_sample))]
        threshold = router.calibrate(sample, s.target_large_share)
        logger.info("auto: threshold %.4g sends %.0f%% of the calibration sample to the best model", threshold,
                    100 * s.target_large_share)
    return BuiltRouter(router, placements, hardware)


def _load_tokenizer(path: str | None):
    from ridgeline.model.checkpoint import read_checkpoint

    return read_checkpoint(path).load_tokenizer()


def _content(message) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # OpenAI content parts: the text ones
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def sample_text(item: dict) -> str:
    """A request body's whole prompt text: every message's, or the completion prompt (token ids: none)."""
    if isinstance(item.get("messages"), list):
        return "\n".join(_content(m) for m in item["messages"])
    prompt = item.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def question_text(item: dict) -> str:
    """What the user asks now: a chat's last user turn (the last message when none is a user's), or the completion
    prompt. Earlier turns and the system prompt say nothing of how hard this question is."""
    messages = item.get("messages")
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        last = users[-1] if users else (messages[-1] if messages else None)
        return _content(last)
    prompt = item.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def estimate_tokens(item: dict | str, chars_per_token: float) -> int:
    text = item if isinstance(item, str) else sample_text(item)
    return max(1, round(len(text) / chars_per_token))
