"""Built-in model specs (from each model's published config) and weight formats (bits per weight).

A spec times a format gives a `ModelShape` without the file: enough for napkin arithmetic about models
too large to download. Norm weights and biases are left out (well under 0.1% of any of these models).
"""

from dataclasses import dataclass

from ridgeline.errors import RidgelineError
from ridgeline.napkin.model_shape import NO_WEIGHTS, ModelShape, WeightGroup


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits_per_weight: float  # including block scales
    source: str
    # Set for formats that, as shipped, quantise only MoE experts: the format of every other weight.
    non_expert_format: str | None = None

    @property
    def integer_blocks(self) -> bool:
        """ggml's block formats: integer quants (MXFP4's FP4 codes too, looked up as int8) with per-block scales,
        which a CPU engine multiplies by int8 dot products (ModelShape.integer_weights)."""
        return self.name not in FLOAT_FORMATS


FLOAT_FORMATS = ("FP32", "FP16", "BF16")


WEIGHT_FORMATS = {
    f.name: f
    for f in (
        WeightFormat("FP32", 32, "IEEE binary32"),
        WeightFormat("FP16", 16, "IEEE binary16"),
        WeightFormat("BF16", 16, "bfloat16"),
        WeightFormat("Q8_0", 8.5, "ggml: blocks of 32 int8 + one fp16 scale = 34 bytes / 32 weights"),
        WeightFormat("Q6_K", 6.5625, "ggml: 256-weight super-blocks of 210 bytes"),
        WeightFormat("Q4_0", 4.5, "ggml: blocks of 32 4-bit + one fp16 scale = 18 bytes / 32 weights"),
        WeightFormat(
            "Q4_K_M",
            4.89,
            "llama.cpp tools/quantize README: Llama-3.1-8B Q4_K_M averages 4.89 bpw "
            "(Q4_K, with Q6_K for some attn_v/ffn_down and the output matrix)",
        ),
        WeightFormat(
            "MXFP4",
            4.25,
            "OCP Microscaling spec: blocks of 32 FP4 (E2M1) + one E8M0 scale = 17 bytes / 32 weights; "
            "gpt-oss ships only its MoE experts in MXFP4, and llama.cpp's conversion stores the rest as Q8_0",
            non_expert_format="Q8_0",
        ),
    )
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # gated MLP width; per expert for MoE
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    reported_params: float  # the model card's total, to check the shapes above against
    source: str
    native_weights: str = "BF16"  # the format the model is released in
    tied_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    sliding_window: int | None = None
    num_sliding_layers: int = 0
    # What a file of this shape declares beyond its matrices (for `ridgeline synth`; the napkin ignores them):
    # llama.cpp's architecture name, RoPE base, norm epsilon, q/k/v biases (Qwen2, gpt-oss), per-head q/k norms
    # (Qwen3), and YaRN's factor and original context (gpt-oss).
    architecture: str = "llama"
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    qk_norm: bool = False
    yarn: tuple[float, int] | None = None

    def attention_params_per_layer(self) -> int:
        q_and_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v

    def mlp_params(self) -> int:
        """One gated MLP (gate, up, down)."""
        return 3 * self.hidden_size * self.intermediate_size

    def shape(self, weights: str | None = None) -> ModelShape:
        fmt = weight_format(weights or self.native_weights)
        bytes_per_param = fmt.bits_per_weight / 8
        other_bytes_per_param = bytes_per_param
        if fmt.non_expert_format and self.num_experts:
            other_bytes_per_param = weight_format(fmt.non_expert_format).bits_per_weight / 8

        def group(params: int, per_param: float) -> WeightGroup:
            return WeightGroup(params, params * per_param)

        embedding = group(self.vocab_size * self.hidden_size, other_bytes_per_param)
        dense_params = self.num_layers * self.attention_params_per_layer()
        experts = NO_WEIGHTS
        if self.num_experts:
            dense_params += self.num_layers * self.hidden_size * self.num_experts  # router
            experts = group(self.num_layers * self.num_experts * self.mlp_params(), bytes_per_param)
        else:
            dense_params += self.num_layers * self.mlp_params()
        return ModelShape(
            name=self.name,
            weights=fmt.name,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            max_context=self.max_context,
            embedding=embedding,
            lm_head=embedding,  # same shape whether tied or not; tied ones are stored once
            dense=group(dense_params, other_bytes_per_param),
            experts=experts,
            num_experts=self.num_experts,
            experts_per_token=self.experts_per_token,
            tied_embeddings=self.tied_embeddings,
            sliding_window=self.sliding_window,
            num_sliding_layers=self.num_sliding_layers,
            integer_weights=fmt.integer_blocks,
        )


MODEL_SPECS = {
    s.name: s
    for s in (
        ModelSpec(
            "llama-2-7b", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32,
            num_heads=32, num_kv_heads=32, head_dim=128, max_context=4096, reported_params=6.74e9,
            source="meta-llama/Llama-2-7b-hf config.json; 6.74B parameters (model card)",
        ),
        ModelSpec(
            "llama-3.1-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
            num_heads=32, num_kv_heads=8, head_dim=128, max_context=131072, reported_params=8.03e9,
            rope_theta=500_000.0,
            source="meta-llama/Llama-3.1-8B config.json; 8.03B parameters (model card)",
        ),
        ModelSpec(
            "llama-3.2-1b", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
            num_heads=32, num_kv_heads=8, head_dim=64, max_context=131072, reported_params=1.24e9,
            tied_embeddings=True, rope_theta=500_000.0,
            source="meta-llama/Llama-3.2-1B config.json; 1.24B parameters (model card)",
        ),
        ModelSpec(
            "llama-3.2-3b", vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_layers=28,
            num_heads=24, num_kv_heads=8, head_dim=128, max_context=131072, reported_params=3.21e9,
            tied_embeddings=True, rope_theta=500_000.0,
            source="meta-llama/Llama-3.2-3B config.json; 3.21B parameters (model card)",
        ),
        ModelSpec(
            "llama-3.3-70b", vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80,
            num_heads=64, num_kv_heads=8, head_dim=128, max_context=131072, reported_params=70.6e9,
            rope_theta=500_000.0,
            source="meta-llama/Llama-3.3-70B-Instruct config.json; 70.6B parameters (model card)",
        ),
        ModelSpec(
            "gpt-oss-120b", vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_layers=36,
            num_heads=64, num_kv_heads=8, head_dim=64, max_context=131072, reported_params=116.83e9,
            native_weights="MXFP4", num_experts=128, experts_per_token=4, sliding_window=128, num_sliding_layers=18,
            architecture="gpt-oss", rope_theta=150_000.0, attention_bias=True, yarn=(32.0, 4096),
            source="openai/gpt-oss-120b config.json (alternating 128-token sliding and full attention); "
            "116.83B total / 5.13B active parameters (gpt-oss model card)",
        ),
        ModelSpec(
            "gpt-oss-20b", vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_layers=24,
            num_heads=64, num_kv_heads=8, head_dim=64, max_context=131072, reported_params=20.91e9,
            native_weights="MXFP4", num_experts=32, experts_per_token=4, sliding_window=128, num_sliding_layers=12,
            architecture="gpt-oss", rope_theta=150_000.0, attention_bias=True, yarn=(32.0, 4096),
            source="openai/gpt-oss-20b config.json (alternating 128-token sliding and full attention); "
            "20.91B total / 3.61B active parameters (gpt-oss model card)",
        ),
        ModelSpec(
            "qwen2.5-1.5b", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
            num_heads=12, num_kv_heads=2, head_dim=128, max_context=131072, reported_params=1.54e9,
            tied_embeddings=True, architecture="qwen2", rope_theta=1_000_000.0, rms_norm_eps=1e-6, attention_bias=True,
            source="Qwen/Qwen2.5-1.5B config.json; 1.54B parameters (model card)",
        ),
        ModelSpec(
            "qwen2.5-7b", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
            num_heads=28, num_kv_heads=4, head_dim=128, max_context=131072, reported_params=7.61e9,
            architecture="qwen2", rope_theta=1_000_000.0, rms_norm_eps=1e-6, attention_bias=True,
            source="Qwen/Qwen2.5-7B config.json; 7.61B parameters (model card)",
        ),
        ModelSpec(
            "qwen2.5-14b", vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_layers=48,
            num_heads=40, num_kv_heads=8, head_dim=128, max_context=131072, reported_params=14.7e9,
            architecture="qwen2", rope_theta=1_000_000.0, rms_norm_eps=1e-6, attention_bias=True,
            source="Qwen/Qwen2.5-14B config.json; 14.7B parameters (model card)",
        ),
        ModelSpec(
            "qwen2.5-32b", vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_layers=64,
            num_heads=40, num_kv_heads=8, head_dim=128, max_context=131072, reported_params=32.5e9,
            architecture="qwen2", rope_theta=1_000_000.0, rms_norm_eps=1e-6, attention_bias=True,
            source="Qwen/Qwen2.5-32B config.json; 32.5B parameters (model card)",
        ),
        ModelSpec(
            "qwen3-8b", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
            num_heads=32, num_kv_heads=8, head_dim=128, max_context=40960, reported_params=8.19e9,
            architecture="qwen3", rope_theta=1_000_000.0, rms_norm_eps=1e-6, qk_norm=True,
            source="Qwen/Qwen3-8B config.json; 8.2B parameters (model card)",
        ),
        ModelSpec(
            "qwen3-30b-a3b", vocab_size=151936, hidden_size=2048, intermediate_size=768, num_layers=48,
            num_heads=32, num_kv_heads=4, head_dim=128, max_context=40960, reported_params=30.5e9,
            num_experts=128, experts_per_token=8,
            architecture="qwen3moe", rope_theta=1_000_000.0, rms_norm_eps=1e-6, qk_norm=True,
            source="Qwen/Qwen3-30B-A3B config.json (moe_intermediate_size 768; every layer MoE); "
            "30.5B total / 3.3B active parameters (model card)",
        ),
        ModelSpec(
            "gemma-3-270m", vocab_size=262144, hidden_size=640, intermediate_size=2048, num_layers=18,
            num_heads=4, num_kv_heads=1, head_dim=256, max_context=32768, reported_params=268e6,
            tied_embeddings=True, sliding_window=512, num_sliding_layers=15,
            architecture="gemma3", rope_theta=1_000_000.0, rms_norm_eps=1e-6,
            source="google/gemma-3-270m config.json (5 of every 6 layers use a 512-token window); "
            "170M embedding + 100M transformer parameters (model card)",
        ),
    )
}


def weight_format(name: str) -> WeightFormat:
    key = name.upper()
    if key not in WEIGHT_FORMATS:
        raise RidgelineError(f"unknown weight format {name!r} (known: {', '.join(WEIGHT_FORMATS)})")
    return WEIGHT_FORMATS[key]


def model_spec(name: str) -> ModelSpec:
    key = name.lower()
    if key not in MODEL_SPECS:
        raise RidgelineError(f"unknown model {name!r}: not a file, and not a built-in spec ({', '.join(MODEL_SPECS)})")
    return MODEL_SPECS[key]
