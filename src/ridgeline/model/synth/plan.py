"""Which tensors a model of a catalogued shape holds, named and shaped as llama.cpp's converter writes them, and
which GGML type each gets under a `--weights` choice (llama.cpp's own mixes: Q4_K_M's extra bits included)."""

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, LlamaFileType

from ridgeline.errors import RidgelineError
from ridgeline.napkin.model_specs import ModelSpec

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gpt-oss")  # what the writer knows how to lay out
LOGIT_STD = 3.0  # logits spread by a few units, as a trained model's are: a peaked softmax, not a one-hot or a flat one


@dataclass(frozen=True)
class WeightsChoice:
    name: str
    base: T  # every matrix not named below
    file_type: LlamaFileType
    output: T | None = None  # the LM head (None: base)
    more_bits: T | None = None  # attn_v and ffn_down in llama.cpp's "more bits" layers (Q4_K_M)
    experts: T | None = None  # MoE expert matrices (None: base)
    help: str = ""


WEIGHTS = {
    w.name: w
    for w in (
        WeightsChoice("f16", T.F16, LlamaFileType.MOSTLY_F16, help="every matrix f16"),
        WeightsChoice("q8_0", T.Q8_0, LlamaFileType.MOSTLY_Q8_0, help="every matrix Q8_0"),
        WeightsChoice("q4_0", T.Q4_0, LlamaFileType.MOSTLY_Q4_0, output=T.Q6_K,
                      help="Q4_0, the LM head Q6_K (as llama-quantize makes it)"),
        WeightsChoice("q4_k", T.Q4_K, LlamaFileType.MOSTLY_Q4_K_S, help="every matrix Q4_K"),
        WeightsChoice("q4_k_m", T.Q4_K, LlamaFileType.MOSTLY_Q4_K_M, output=T.Q6_K, more_bits=T.Q6_K,
                      help="Q4_K; Q6_K for the LM head and for attn_v/ffn_down in llama.cpp's 'more bits' layers"),
        WeightsChoice("q6_k", T.Q6_K, LlamaFileType.MOSTLY_Q6_K, help="every matrix Q6_K"),
        WeightsChoice("mxfp4", T.Q8_0, LlamaFileType.MOSTLY_MXFP4_MOE, experts=T.MXFP4,
                      help="MoE experts MXFP4, everything else Q8_0 (gpt-oss as released)"),
    )
}
FALLBACK = T.Q8_0  # for rows a type's blocks do not divide (gpt-oss's 2880-wide rows under a K-quant), as llama.cpp
# falls back to a 32-wide type


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]  # numpy order: (experts,) rows, columns
    qtype: T
    std: float  # of the values (matrices, biases); norms are ones
    kind: str  # "matrix", "norm" or "vector"


def weights_choice(name: str) -> WeightsChoice:
    if name.lower() not in WEIGHTS:
        raise RidgelineError(f"unknown weights type {name!r} (choose from {', '.join(WEIGHTS)})")
    return WEIGHTS[name.lower()]


def check_shape(spec: ModelSpec) -> None:
    if spec.architecture not in ARCHITECTURES:
        raise RidgelineError(f"ridgeline synth cannot write the {spec.architecture} architecture of {spec.name} "
                             f"(it writes {', '.join(ARCHITECTURES)})")


def uses_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M rule for attn_v and ffn_down: the first and last eighth of the layers, and every third
    one between."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2


def _matrix_type(qtype: T, columns: int) -> T:
    return qtype if columns % GGML_QUANT_SIZES[qtype][0] == 0 else FALLBACK


def tensor_plan(spec: ModelSpec, choice: WeightsChoice, layers: int, vocab: int) -> list[PlannedTensor]:
    check_shape(spec)
    if choice.experts is not None and not spec.num_experts:
        raise RidgelineError(f"{choice.name} quantises MoE experts, and {spec.name} has none")
    hidden, hd = spec.hidden_size, spec.head_dim
    q, kv, ffn = spec.num_heads * hd, spec.num_kv_heads * hd, spec.intermediate_size
    plan: list[PlannedTensor] = []

    def matrix(name: str, shape: tuple[int, ...], qtype: T, std: float | None = None) -> None:
        columns = shape[-1]
        plan.append(PlannedTensor(name, shape, _matrix_type(qtype, columns), std or columns**-0.5, "matrix"))

    def norm(name: str, size: int) -> None:
        plan.append(PlannedTensor(name, (size,), T.F32, 0.0, "norm"))

    def vector(name: str, shape: tuple[int, ...], std: float) -> None:
        plan.append(PlannedTensor(name, shape, T.F32, std, "vector"))

    head_std = LOGIT_STD * hidden**-0.5
    # The embedding feeds an RMSNorm (its scale does not matter there); tied, it is the LM head as well, and
    # takes the head's type (as llama-quantize gives it)
    embedding_type = (choice.output or choice.base) if spec.tied_embeddings else choice.base
    matrix("token_embd.weight", (vocab, hidden), embedding_type, head_std)
    for i in range(layers):
        p = f"blk.{i}"
        # by the whole shape's layer count: a file cut to N layers holds the first N layers of the whole one
        more = choice.base
        if choice.more_bits is not None and uses_more_bits(i, spec.num_layers):
            more = choice.more_bits
        norm(f"{p}.attn_norm.weight", hidden)
        matrix(f"{p}.attn_q.weight", (q, hidden), choice.base)
        matrix(f"{p}.attn_k.weight", (kv, hidden), choice.base)
        matrix(f"{p}.attn_v.weight", (kv, hidden), more)
        matrix(f"{p}.attn_output.weight", (hidden, q), choice.base)
        if spec.attention_bias:
            for name, size in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                vector(f"{p}.{name}.bias", (size,), 0.02)
        if spec.architecture == "gpt-oss":
            vector(f"{p}.attn_output.bias", (hidden,), 0.02)
            vector(f"{p}.attn_sinks.weight", (spec.num_heads,), 1.0)
        if spec.qk_norm:
            norm(f"{p}.attn_q_norm.weight", hd)
            norm(f"{p}.attn_k_norm.weight", hd)
        norm(f"{p}.post_attention_norm.weight" if spec.architecture == "gpt-oss" else f"{p}.ffn_norm.weight", hidden)
        if spec.num_experts:
            experts, expert_type = spec.num_experts, choice.experts or choice.base
            down_type = choice.experts or more
            vector(f"{p}.ffn_gate_inp.weight", (experts, hidden), hidden**-0.5)  # llama.cpp keeps routers f32
            matrix(f"{p}.ffn_gate_exps.weight", (experts, ffn, hidden), expert_type)
            matrix(f"{p}.ffn_up_exps.weight", (experts, ffn, hidden), expert_type)
            matrix(f"{p}.ffn_down_exps.weight", (experts, hidden, ffn), down_type)
            if spec.architecture == "gpt-oss":
                vector(f"{p}.ffn_gate_inp.bias", (experts,), 0.02)
                for name, size in (("ffn_gate_exps", ffn), ("ffn_up_exps", ffn), ("ffn_down_exps", hidden)):
                    vector(f"{p}.{name}.bias", (experts, size), 0.02)
        else:
            matrix(f"{p}.ffn_gate.weight", (ffn, hidden), choice.base)
            matrix(f"{p}.ffn_up.weight", (ffn, hidden), choice.base)
            matrix(f"{p}.ffn_down.weight", (hidden, ffn), more)
    norm("output_norm.weight", hidden)
    if not spec.tied_embeddings:
        matrix("output.weight", (vocab, hidden), choice.output or choice.base, head_std)
    return plan
