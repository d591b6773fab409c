"""The hyper-parameters of a decoder-only transformer, independent of the file format it came from."""

from dataclasses import dataclass

from ridgeline.errors import ModelLoadError, UnsupportedError

SUPPORTED_ARCHITECTURES = ("gemma3", "llama", "mistral", "qwen2", "qwen3", "qwen3moe", "gpt-oss")
# How a mixture-of-experts router turns a token's logits into its experts' weights:
# "softmax_topk": softmax over all experts, keep the top k (Qwen3-MoE; renormalised when norm_topk_prob);
# "topk_softmax": keep the top k logits, softmax over those (gpt-oss).
ROUTINGS = ("softmax_topk", "topk_softmax")


@dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling (gpt-oss): low frequencies interpolated by `factor`, high ones kept, a ramp between."""

    factor: float
    original_context: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # round the ramp's ends to whole dimensions (llama.cpp always does; HF gpt-oss does not)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    rms_norm_eps: float
    rope_theta: float
    # Gemma 3: local (sliding-window) layers use their own RoPE base and window.
    rope_local_theta: float | None = None
    sliding_window: int | None = None
    # Which layers use the sliding window; empty means none do.
    sliding_layers: tuple[int, ...] = ()
    rope_linear_factor: float = 1.0  # global-layer linear position scaling (Gemma 3 4B+)
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    # Gemma specifics
    qk_norm: bool = False
    sandwich_norms: bool = False  # norms after attention and MLP as well as before
    embedding_scale: float = 1.0
    attention_scale: float | None = None  # None: 1/sqrt(head_dim)
    activation: str = "silu"  # "silu", "gelu_tanh" or "swiglu_oai" (gpt-oss: clamped, with swiglu_alpha/limit)
    tie_word_embeddings: bool = False
    rope_yarn: YarnScaling | None = None
    attention_sinks: bool = False  # gpt-oss: a learned per-head logit joins each softmax's denominator
    # Mixture of experts (num_experts = 0: a dense gated MLP in every layer)
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    routing: str = "softmax_topk"
    norm_topk_prob: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        from ridgeline.model.metadata_values import MAX_LAYERS, metadata_float, metadata_int

        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedError(
                f"unsupported architecture {self.architecture!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        # A model file may claim anything: a string, a zero or a NaN here would fail far away, deep in a layer.
        metadata_int("vocab_size", self.vocab_size, low=0)  # 0: taken from the embedding's rows afterwards
        for name in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "max_context"):
            metadata_int(name, getattr(self, name))
        metadata_int("num_layers", self.num_layers, low=0, high=MAX_LAYERS)  # 0: header and vocabulary alone
        if self.sliding_window is not None:
            metadata_int("sliding_window", self.sliding_window)
        for name in ("rms_norm_eps", "rope_theta", "rope_linear_factor", "embedding_scale"):
            metadata_float(name, getattr(self, name))
        for name in ("rope_local_theta", "attention_scale"):
            if getattr(self, name) is not None:
                metadata_float(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"{self.num_heads} attention heads do not split into {self.num_kv_heads} KV heads")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ModelLoadError(f"{self.experts_per_token} experts per token out of {self.num_experts} experts")
        if self.routing not in ROUTINGS:
            raise ModelLoadError(f"unknown expert routing {self.routing!r} (known: {', '.join(ROUTINGS)})")

    @property
    def query_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    def is_sliding(self, layer: int) -> bool:
        return layer in self.sliding_layers

    @property
    def softmax_scale(self) -> float:
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """2 (K and V) x kv_heads x head_dim x layers x bytes: what every cached token costs."""
        return 2 * self.num_kv_heads * self.head_dim * self.num_layers * dtype_bytes
