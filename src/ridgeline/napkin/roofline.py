"""The napkin model: where prefill and decode of one model sit on one machine's roofline.

A step costs FLOPs and bytes; it takes max(FLOPs / peak, bytes / bandwidth). Decode at batch B reads the
weights once for B tokens (plus each sequence's KV cache), prefill of L tokens reads them once for L
tokens; so decode's arithmetic intensity grows with B and prefill's with L, and the ridge point
(peak / bandwidth) says where each phase stops waiting on memory.
"""

import math
from dataclasses import dataclass

from ridgeline.napkin.hardware import Hardware
from ridgeline.napkin.model_shape import ModelShape

# Real decode lands at roughly 40-60% of the bandwidth ceiling (the source documents' observation).
REALISTIC_BAND = (0.40, 0.60)
LARGEST_BATCH_SEARCHED = 2**24


@dataclass(frozen=True)
class Workload:
    batch: int = 1  # concurrent sequences decoding together
    context: int = 0  # tokens already in each sequence's KV cache while decoding
    prompt_tokens: int = 2048  # prefill length
    kv_dtype_bytes: float = 2  # FP16 KV cache
    precision: str | None = None  # matmul precision; None: the machine's for the weights (Hardware.matmul_precision)


@dataclass(frozen=True)
class StepCost:
    flops: float
    nbytes: float
    tokens: int  # tokens the step produces (decode) or consumes (prefill)

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.nbytes


@dataclass(frozen=True)
class PhaseEstimate:
    cost: StepCost
    seconds: float  # lower bound for the step on this machine
    bound: str  # "memory" or "compute"

    @property
    def tokens_per_s(self) -> float:
        return self.cost.tokens / self.seconds

    @property
    def attained_flops(self) -> float:
        return self.cost.flops / self.seconds


def decode_ceiling(bandwidth: float, bytes_per_token: float) -> float:
    """Tokens/s at batch 1 if every token has to stream `bytes_per_token` through `bandwidth`."""
    return bandwidth / bytes_per_token


def ridge_point(flops: float, bandwidth: float) -> float:
    return flops / bandwidth


class Roofline:
    """One model on one machine, at one matmul precision and KV-cache element size."""

    def __init__(self, shape: ModelShape, hardware: Hardware, precision: str | None = None, kv_dtype_bytes: float = 2):
        self.shape = shape
        self.hardware = hardware
        self.precision = precision or hardware.matmul_precision(shape.integer_weights)
        self.peak_flops = hardware.flops(self.precision)
        self.kv_dtype_bytes = kv_dtype_bytes

    @property
    def ridge(self) -> float:
        return ridge_point(self.peak_flops, self.hardware.bandwidth)

    def attainable_flops(self, intensity: float) -> float:
        """The roof: bandwidth-limited slope below the ridge, flat peak above it."""
        return min(self.peak_flops, self.hardware.bandwidth * intensity)

    def decode_cost(self, batch: int = 1, context: int = 0) -> StepCost:
        """One decode step for `batch` sequences, each with `context` tokens already cached."""
        shape = self.shape
        flops = batch * (shape.matmul_flops_per_token() + shape.attention_flops_per_token(context))
        kv_read = batch * shape.kv_bytes_for_context(context, self.kv_dtype_bytes)
        return StepCost(flops, shape.weight_bytes_read(batch) + kv_read, batch)

    def prefill_cost(self, prompt_tokens: int) -> StepCost:
        """One prompt of `prompt_tokens` in a single pass: weights read once, its KV written once, and logits for its
        last token only (the first output token's)."""
        shape = self.shape
        flops = shape.matmul_flops(prompt_tokens, 1) + shape.prefill_attention_flops(prompt_tokens)
        kv_written = shape.kv_bytes_for_context(prompt_tokens, self.kv_dtype_bytes)
        return StepCost(flops, shape.weight_bytes_read(prompt_tokens) + kv_written, prompt_tokens)

    def estimate(self, cost: StepCost) -> PhaseEstimate:
        compute_s = cost.flops / self.peak_flops
        memory_s = cost.nbytes / self.hardware.bandwidth
        return PhaseEstimate(cost, max(compute_s, memory_s), "compute" if compute_s >= memory_s else "memory")

    def decode(self, batch: int = 1, context: int = 0) -> PhaseEstimate:
        return self.estimate(self.decode_cost(batch, context))

    def prefill(self, prompt_tokens: int) -> PhaseEstimate:
        return self.estimate(self.prefill_cost(prompt_tokens))

    def decode_bytes_per_token(self, context: int = 0) -> float:
        """Bytes one batch-1 decode step reads: the weights it touches plus the KV cache at `context`."""
        return self.decode_cost(1, context).nbytes

    def compute_bound_batch(self, context: int = 0) -> int | None:
        """Smallest decode batch whose intensity reaches the ridge; None if KV traffic keeps it below forever."""
        if self.decode_cost(LARGEST_BATCH_SEARCHED, context).intensity < self.ridge:
            return None
        low, high = 1, LARGEST_BATCH_SEARCHED  # intensity grows with batch: bisect
        while low < high:
            middle = (low + high) // 2
            if self.decode_cost(middle, context).intensity >= self.ridge:
                high = middle
            else:
                low = middle + 1
        return low

    def free_memory_bytes(self) -> float:
        """Memory left for the KV cache once the weights are resident."""
        return self.hardware.memory_bytes - self.shape.total_weight_bytes

    def max_batch_at_context(self, context: int) -> int:
        free = self.free_memory_bytes()
        if free <= 0:
            return 0
        return int(free // self.shape.kv_bytes_for_context(max(context, 1), self.kv_dtype_bytes))

    def max_context_at_batch(self, batch: int) -> int:
        """Longest context (capped at the model's) that `batch` sequences can all hold at once."""
        free = self.free_memory_bytes()

        def fits(context: int) -> bool:
            return batch * self.shape.kv_bytes_for_context(context, self.kv_dtype_bytes) <= free

        if not fits(1):
            return 0
        low, high = 1, self.shape.max_context
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(middle) else (low, middle - 1)
        return low

    def summary(self, workload: Workload) -> dict:
        """Every figure `ridgeline roofline` reports, as plain numbers (bytes, seconds, FLOP/s)."""
        shape = self.shape
        decode_1 = self.decode(1, workload.context)
        decode_b = self.decode(workload.batch, workload.context)
        prefill = self.prefill(workload.prompt_tokens)
        kv_gqa = shape.kv_bytes_per_token(self.kv_dtype_bytes)
        kv_mha = shape.kv_bytes_per_token(self.kv_dtype_bytes, num_kv_heads=shape.num_heads)
        kv_context_batch = workload.batch * shape.kv_bytes_for_context(workload.context, self.kv_dtype_bytes)
        kv_context_batch_mha = workload.batch * shape.kv_bytes_for_context(
            workload.context, self.kv_dtype_bytes, num_kv_heads=shape.num_heads
        )
        return {
            "model": shape.name,
            "weights": shape.weights,
            "hardware": self.hardware.name,
            "precision": self.precision,
            "workload": vars(workload) | {"precision": self.precision},
            "params": shape.total_params,
            "active_params_per_token": shape.active_params,
            "weight_bytes": shape.total_weight_bytes,
            "bandwidth_bytes_per_s": self.hardware.bandwidth,
            "peak_flops": self.peak_flops,
            "ridge_flop_per_byte": self.ridge,
            "decode": {
                "weight_bytes_per_token": shape.weight_bytes_read(1),
                "kv_bytes_per_token_at_context": shape.kv_bytes_for_context(workload.context, self.kv_dtype_bytes),
                "bytes_per_token": decode_1.cost.nbytes,
                "ceiling_tokens_per_s": decode_1.tokens_per_s,
                "realistic_tokens_per_s": [decode_1.tokens_per_s * f for f in REALISTIC_BAND],
                "intensity_batch_1": decode_1.cost.intensity,
                "batch": workload.batch,
                "intensity_at_batch": decode_b.cost.intensity,
                "bound_at_batch": decode_b.bound,
                "tokens_per_s_at_batch": decode_b.tokens_per_s,
                "inter_token_latency_s_at_batch": decode_b.seconds,
                "compute_bound_from_batch": self.compute_bound_batch(workload.context),
            },
            "prefill": {
                "prompt_tokens": workload.prompt_tokens,
                "intensity": prefill.cost.intensity,
                "bound": prefill.bound,
                "seconds": prefill.seconds,
                "ttft_s": prefill.seconds,
                "tokens_per_s": prefill.tokens_per_s,
            },
            "kv": {
                "bytes_per_token": kv_gqa,
                "bytes_per_token_full_mha": kv_mha,
                "gqa_reduction": kv_mha / kv_gqa,
                "context": workload.context,
                "bytes_for_context_and_batch": kv_context_batch,
                "bytes_for_context_and_batch_full_mha": kv_context_batch_mha,
            },
            "memory": {
                "capacity_bytes": self.hardware.memory_bytes,
                "free_after_weights_bytes": self.free_memory_bytes(),
                "fits": self.free_memory_bytes() > 0,
                "kv_token_capacity": max(0.0, math.floor(self.free_memory_bytes() / kv_gqa)),
                "max_batch_at_context": self.max_batch_at_context(workload.context),
                "max_context_at_batch": self.max_context_at_batch(workload.batch),
            },
        }
