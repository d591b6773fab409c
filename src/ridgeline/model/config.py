"""The hyper-parameters of a decoder-only transformer, independent of the file format it came from."""

from dataclasses import dataclass

SUPPORTED_ARCHITECTURES = ("gemma3", "llama", "mistral", "qwen2")


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
    activation: str = "silu"  # "silu" or "gelu_tanh"
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            from ridgeline.errors import UnsupportedError

            raise UnsupportedError(
                f"unsupported architecture {self.architecture!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )

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
