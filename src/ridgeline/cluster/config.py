"""The router's configuration file (TOML): its own settings, and the backends it serves.

    [router]
    hardware = "this-machine"          # roofline priors for rates before anything is measured
    threshold = 0.05                   # tier trade for `auto` (quality per second); or calibrate it:
    target_large_share = 0.3           #   share of the sample's requests to send to the best model
    calibration_sample = "sample.jsonl"  # one {"prompt": ...} or {"messages": [...]} per line
    expected_output_tokens = 128       # decode length assumed when a request sets no max_tokens
    health_interval_s = 1.0
    policy = "cost"                    # which replica takes a request: cost (prefix cache and counted load) or
                                       #   round_robin (each replica in turn, blind to both: the baseline)
    memory = "16GB"                    # optional: load only the tiers that fit (same as --memory)
    objective = "quality"              # what `auto` trades: quality (the threshold above) or cost: the cheapest
    slo_ttft_ms = 500                  #   model predicted to meet these SLOs (each backend needs usd_per_hour)
    slo_itl_ms = 50

    [[backend]]                        # one entry per backend; entries naming one model are its replicas
    model = "gemma-3-270m"             # the name clients use
    kind = "engine"                    # engine (in this process) | ray (Ray actors) | openai (any OpenAI server)
    path = "gemma.gguf"                # engine / ray: GGUF file or HF directory (omit: the bundled model)
    replicas = 2                       # engine / ray: this many workers
    quality = 0.62                     # the model's figure from an evaluation (higher is better)
    kv_cache_memory = "512MiB"
    url = "http://127.0.0.1:8080"      # openai: base URL (the router appends /v1/...)
    served_name = "llama"              # openai: the model name that server expects (default: `model`)
    usd_per_hour = 3.0                 # what one replica's machine costs an hour: $/Mtok in /metrics and /v1/router
"""

import json
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from ridgeline.errors import RidgelineError

KINDS = ("engine", "ray", "openai")
POLICIES = ("cost", "round_robin")
OBJECTIVES = ("quality", "cost")


@dataclass(frozen=True)
class BackendConfig:
    model: str
    kind: str = "engine"
    path: str | None = None
    replicas: int = 1
    quality: float = 0.5
    url: str | None = None
    served_name: str | None = None
    api_key: str | None = None
    kv_cache_memory: str = "512MiB"
    kv_cache_dtype: str = "bf16"
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    threads: int | None = None
    num_cpus: float = 1.0  # ray: CPUs each actor reserves
    prefill_tokens_per_s: float | None = None  # priors; otherwise the roofline's
    decode_tokens_per_s: float | None = None
    chars_per_token: float = 4.0  # openai: to estimate prompt tokens without its tokenizer
    usd_per_hour: float | None = None  # one replica's machine, per hour: its $/Mtok, and `auto`'s cost objective

    def __post_init__(self) -> None:
        if self.usd_per_hour is not None and (isinstance(self.usd_per_hour, bool) or
                                              not isinstance(self.usd_per_hour, (int, float)) or self.usd_per_hour < 0):
            raise RidgelineError(f"backend {self.model!r}: usd_per_hour must be a number >= 0")
        if self.kind not in KINDS:
            raise RidgelineError(f"backend {self.model!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "openai" and not self.url:
            raise RidgelineError(f"backend {self.model!r}: kind 'openai' needs a url")
        if self.replicas < 1:
            raise RidgelineError(f"backend {self.model!r}: replicas must be at least 1")
        if self.model == "auto":
            raise RidgelineError("'auto' is the router's own model name; name the backend something else")


@dataclass(frozen=True)
class RouterSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    hardware: str = "this-machine"
    threshold: float = 0.05
    target_large_share: float | None = None
    calibration_sample: str | None = None
    expected_output_tokens: int = 128
    health_interval_s: float = 1.0
    health_timeout_s: float = 5.0
    policy: str = "cost"
    memory: str | None = None
    api_key: str | None = None
    ray_address: str | None = None  # None: a Ray backend starts a small local Ray cluster
    objective: str = "quality"  # `auto`: quality (the threshold's trade) or cost (cheapest within the SLOs)
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise RidgelineError(f"[router] policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.objective not in OBJECTIVES:
            raise RidgelineError(f"[router] objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.objective == "cost" and self.slo_ttft_ms is None and self.slo_itl_ms is None:
            raise RidgelineError("[router] objective = \"cost\" needs an SLO to keep: slo_ttft_ms and/or slo_itl_ms")


@dataclass(frozen=True)
class RouterConfig:
    router: RouterSettings = field(default_factory=RouterSettings)
    backends: tuple[BackendConfig, ...] = ()
    base_dir: Path = Path(".")

    def models(self) -> dict[str, list[BackendConfig]]:
        grouped: dict[str, list[BackendConfig]] = {}
        for backend in self.backends:
            grouped.setdefault(backend.model, []).append(backend)
        return grouped

    def resolve(self, path: str | None) -> str | None:
        """Paths in the file are relative to the file."""
        return None if path is None else str((self.base_dir / Path(path).expanduser()))


def _typed(cls, table: dict, where: str):
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise RidgelineError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    try:
        return cls(**table)
    except TypeError as error:
        raise RidgelineError(f"{where}: {error}") from None


def parse_config(data: dict, base_dir: Path = Path(".")) -> RouterConfig:
    unknown = sorted(set(data) - {"router", "backend"})
    if unknown:
        raise RidgelineError(f"router config: unknown table(s) {', '.join(unknown)} (known: router, backend)")
    settings = _typed(RouterSettings, data.get("router", {}), "[router]")
    backends = tuple(_typed(BackendConfig, b, f"[[backend]] #{i + 1}") for i, b in enumerate(data.get("backend", [])))
    if not backends:
        raise RidgelineError("router config names no [[backend]]")
    unpriced = sorted({b.model for b in backends if b.usd_per_hour is None})
    if settings.objective == "cost" and unpriced:
        raise RidgelineError(f"[router] objective = \"cost\" needs usd_per_hour on every [[backend]]; "
                             f"none on {', '.join(unpriced)}")
    return RouterConfig(settings, backends, base_dir)


def load_config(path: str | Path) -> RouterConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RidgelineError(f"router config not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise RidgelineError(f"router config {path} is not valid TOML: {error}") from None
    return parse_config(data, path.parent)


def load_sample(path: str | Path) -> list[dict]:
    """A traffic sample: one JSON object per line with "prompt" (text) or "messages" (chat)."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError as error:
        raise RidgelineError(f"calibration sample {path}: not one JSON object per line ({error})") from None
