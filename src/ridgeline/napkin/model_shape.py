"""What the roofline needs to know about a model: how many bytes and FLOPs each token costs.

Weights fall in four groups because a decode step reads each differently: the token embedding (one row
per token), the LM head (all of it, every step; for tied embeddings it *is* the embedding matrix), the
dense weights (all of them, every step) and MoE experts (only the experts the router picks).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightGroup:
    params: float
    nbytes: float

    def __add__(self, other: "WeightGroup") -> "WeightGroup":
        return WeightGroup(self.params + other.params, self.nbytes + other.nbytes)


NO_WEIGHTS = WeightGroup(0, 0)


@dataclass(frozen=True)
class ModelShape:
    name: str
    weights: str  # the weight format, e.g. "Q4_K_M", or "as stored" for a file
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    embedding: WeightGroup
    lm_head: WeightGroup  # equal to `embedding` when tied
    dense: WeightGroup  # attention, dense MLP, router, norms: read once per step whatever the batch
    experts: WeightGroup = NO_WEIGHTS  # all experts of all layers
    num_experts: int = 0
    experts_per_token: int = 0
    tied_embeddings: bool = False
    sliding_window: int | None = None
    num_sliding_layers: int = 0
    # Matmul weights in integer blocks (GGUF's quantised types): a machine with int8 dot-product kernels multiplies
    # them at its int8 rate, without dequantising to floats first (Hardware.matmul_precision).
    integer_weights: bool = False

    @property
    def total_params(self) -> float:
        return sum(group.params for group in self._stored_groups())

    @property
    def total_weight_bytes(self) -> float:
        """Bytes of weights held in memory (a tied embedding once)."""
        return sum(group.nbytes for group in self._stored_groups())

    @property
    def active_params(self) -> float:
        """Matmul weights one token multiplies by (the embedding lookup does no matmul)."""
        return self.lm_head.params + self.dense.params + self.experts.params * self._expert_share()

    def matmul_flops_per_token(self) -> float:
        """Matmul FLOPs of a row that goes through every layer and the LM head (a decode row)."""
        return 2 * self.active_params

    def matmul_flops(self, tokens: float, sampled_rows: float) -> float:
        """Matmul FLOPs of a forward pass over `tokens` rows, `sampled_rows` of which go through the LM head. Only a
        row whose next token is sampled needs logits (a prompt's last token, a decode row, a guess being verified);
        a prompt's other tokens stop after the last layer, as every engine computes them. Counting the LM head for
        every prompt token put Gemma 3 270M's prefill at 2.7x its FLOPs, and the engine's prompt steps above the
        compute roof."""
        lm_head = 2 * self.lm_head.params
        return tokens * (self.matmul_flops_per_token() - lm_head) + sampled_rows * lm_head

    def decode_row_flops_ratio(self) -> float:
        """A decode row's matmul FLOPs over a prompt token's: a prompt token that samples nothing skips the LM head,
        a decode row computes it (Gemma 3 270M: 2.7, its 262k-row LM head outweighing all its layers)."""
        body = self.matmul_flops(1, 0)
        return self.matmul_flops_per_token() / body if body > 0 else 1.0

    def expert_fraction_read(self, tokens: float) -> float:
        """Expected share of experts a step over `tokens` tokens touches, if routing spreads uniformly."""
        if not self.num_experts:
            return 0.0
        return 1 - (1 - self._expert_share()) ** tokens

    def weight_bytes_read(self, tokens: float) -> float:
        """Weight bytes one forward step over `tokens` tokens reads from memory."""
        embedding_rows = min(tokens, self.vocab_size) * self.embedding.nbytes / self.vocab_size
        experts = self.experts.nbytes * self.expert_fraction_read(tokens)
        return embedding_rows + self.lm_head.nbytes + self.dense.nbytes + experts

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2, num_kv_heads: int | None = None) -> float:
        """2 (K and V) x kv heads x head dim x layers x bytes. `num_kv_heads=num_heads` gives full MHA."""
        return 2 * (num_kv_heads or self.num_kv_heads) * self.head_dim * self.num_layers * kv_dtype_bytes

    def kv_bytes_for_context(self, context: int, kv_dtype_bytes: float = 2, num_kv_heads: int | None = None) -> float:
        """KV bytes one sequence holds at `context` tokens (sliding-window layers keep only the window)."""
        per_layer_token = self.kv_bytes_per_token(kv_dtype_bytes, num_kv_heads) / self.num_layers
        return per_layer_token * self.attended_positions(context)

    def attended_positions(self, context: int) -> int:
        """Cached positions summed over layers that a token at position `context` attends to."""
        window = min(context, self.sliding_window or context)
        full_layers = self.num_layers - self.num_sliding_layers
        return full_layers * context + self.num_sliding_layers * window

    def attention_flops_per_token(self, context: int) -> float:
        """Q.K^T and scores.V for one query at `context` cached positions: 2 x 2 x heads x head_dim each."""
        return 4 * self.num_heads * self.head_dim * self.attended_positions(context)

    def prefill_attention_flops(self, prompt_tokens: int) -> float:
        """Causal attention over a whole prompt: token i attends to the i positions before it."""
        full_layers = self.num_layers - self.num_sliding_layers
        window = self.sliding_window or prompt_tokens
        full = prompt_tokens * (prompt_tokens - 1) / 2
        if prompt_tokens <= window:
            sliding = full
        else:
            sliding = window * (window - 1) / 2 + (prompt_tokens - window) * window
        return 4 * self.num_heads * self.head_dim * (full_layers * full + self.num_sliding_layers * sliding)

    def _expert_share(self) -> float:
        return self.experts_per_token / self.num_experts if self.num_experts else 0.0

    def _stored_groups(self) -> list[WeightGroup]:
        groups = [self.embedding, self.dense, self.experts]
        return groups if self.tied_embeddings else groups + [self.lm_head]
