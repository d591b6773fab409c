"""Memory-aware placement: given a budget (`--memory 16GB`), load only the tiers whose weights and KV cache fit,
in the order the config lists them, and say of each tier left out why (the napkin's `advise` decides the fit,
so the reason reads like its answer)."""

from dataclasses import dataclass

from ridgeline.cluster.config import BackendConfig, RouterConfig

# A request shape for the fit check beyond the KV pool the engine reserves: one typical stream.
FIT_PROMPT_TOKENS, FIT_OUTPUT_TOKENS = 512, 128


@dataclass(frozen=True)
class Placement:
    backend: BackendConfig
    loaded: bool
    weight_bytes: float
    kv_bytes: float
    reason: str  # why it was left out, or what it costs

    @property
    def total_bytes(self) -> float:
        return (self.weight_bytes + self.kv_bytes) * self.backend.replicas


def place(config: RouterConfig, budget_bytes: float | None, hardware) -> list[Placement]:
    """One Placement per backend; HTTP backends take no local memory and are always kept."""
    from ridgeline.engine.options import parse_bytes
    from ridgeline.napkin.advise import RequestShape, advise_one
    from ridgeline.model.model_source import load_model_shape

    remaining = budget_bytes
    placements = []
    for backend in config.backends:
        if backend.kind == "openai":
            placements.append(Placement(backend, True, 0.0, 0.0, f"remote at {backend.url}"))
            continue
        shape = load_model_shape(config.resolve(backend.path))
        kv = float(parse_bytes(backend.kv_cache_memory))
        need = (shape.total_weight_bytes + kv) * backend.replicas
        if remaining is None:
            placements.append(Placement(backend, True, shape.total_weight_bytes, kv, "no memory budget given"))
            continue
        # advise checks weights + one stream's KV against what the reserved KV pools leave of the budget.
        advice = advise_one(shape, hardware, RequestShape(FIT_PROMPT_TOKENS, FIT_OUTPUT_TOKENS),
                            budget_bytes=max(1.0, remaining - kv * backend.replicas - shape.total_weight_bytes
                                             * (backend.replicas - 1)))
        cost = (f"{_size(need)} ({backend.replicas} x ({_size(shape.total_weight_bytes)} weights + {_size(kv)} KV "
                f"cache))")
        if advice.fits and need <= remaining:
            remaining -= need
            placements.append(Placement(backend, True, shape.total_weight_bytes, kv,
                                        f"{cost}, ~{advice.tokens_per_s_per_stream:,.0f} tok/s per stream (napkin); "
                                        f"{_size(remaining)} of the budget left"))
        else:
            placements.append(Placement(backend, False, shape.total_weight_bytes, kv,
                                        f"needs {cost}, only {_size(remaining)} of the budget left"))
    return placements


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"
