"""llama-bench-style latency: prompt processing (pp) and token generation (tg) tok/s, set against the roofline.

pp: one forward pass over a prompt of `prompt_tokens` random token ids (logits for the last one only).
tg: `gen_tokens` one-token forward passes from an empty cache, each feeding back the argmax.
Both run straight on the model (no scheduler, no sampling), as llama-bench does. Next to them: the bytes a
decode step reads (the weights it touched, counted by the engine: shared weights + the experts its token was routed
to in an MoE model, + the average KV cache), the napkin model's figure for the same weights, this machine's
read bandwidth and matmul FLOP/s as `ridgeline measure` cached them (with when, threads and spread), and the
napkin decode ceiling = bandwidth / bytes per token.
"""

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

import torch

from ridgeline.machine.measure import torch_threads
from ridgeline.machine.this_machine import this_machine
from ridgeline.model.model_source import shape_from_checkpoint
from ridgeline.engine.assemble import assemble_model
from ridgeline.engine.sampler import argmax_rows
from ridgeline.engine.kv_cache import KVCacheConfig, bytes_per_token
from ridgeline.engine.model_runner import ModelRunner
from ridgeline.errors import RidgelineError
from ridgeline.model.attention_batch import ForwardChunk
from ridgeline.model.checkpoint import Checkpoint, read_checkpoint
from ridgeline.model.layers.linear import DenseLinear
from ridgeline.model.layers.moe import MixtureOfExperts
from ridgeline.model.quant import QuantizedLinear
from ridgeline.model.step_bytes import last_step_bytes
from ridgeline.model.transformer import ModelOptions
from ridgeline.napkin import hardware
from ridgeline.napkin.model_shape import WeightGroup

WEIGHT_MODES = ("quantized", "bf16", "f32")  # quantised in memory (f32 activations), or dequantised at load
CACHE = KVCacheConfig(block_size=16, dtype="bf16", memory_bytes=0)  # sized in blocks for one sequence


@dataclass(frozen=True)
class LatencyConfig:
    model: str | None = None  # None: the bundled default model
    prompt_tokens: int = 512
    gen_tokens: int = 128
    threads: int | None = None
    repetitions: int = 3
    weights: tuple[str, ...] = WEIGHT_MODES
    lm_head: str = "keep"  # or requantise the LM head: "q8", "q4" (see model/quant/requantize.py)
    seed: int = 0


@dataclass
class LatencyResult:
    weights: str
    threads: int
    prompt_tokens: int
    gen_tokens: int
    pp_tok_s: list[float]
    tg_tok_s: list[float]
    weight_bytes: int  # every weight as held in memory, norms included
    # Weight bytes a decode step read, counted by the engine (model/step_bytes.py): shared weights + routed experts
    # + the token's embedding row; for a dense model all of weight_bytes. Averaged over tg steps.
    decode_weight_bytes: float
    napkin_weight_bytes: float  # the roofline's figure for the same weights: matrices + embedding row, k/E of experts
    kv_bytes_per_step: float  # average KV cache read per tg step (context grows 0 .. gen_tokens)
    read_bandwidth: float  # bytes/s, this machine's measurement
    matmul_flops: float  # FLOP/s (ops/s for int8) of the precision below, this machine's measurement
    linear_flops_per_token: float  # 2 x (linear-layer weights) for a prefill token; the LM head runs once per prompt
    tg_step_ms: float  # one decode step, from an extra instrumented tg run ...
    tg_linear_ms: float  # ... of which inside the linear layers (matmul kernels + their call overhead)
    matmul_precision: str = "bf16"  # what the prompt's matmuls ran in: int8 for quantised weights on the kernels
    machine: str = ""  # where the two ceilings came from: this machine's measurement, when, threads, spread

    @property
    def bytes_per_token(self) -> float:
        return self.decode_weight_bytes + self.kv_bytes_per_step

    @property
    def ceiling_tok_s(self) -> float:
        return self.read_bandwidth / self.bytes_per_token

    @property
    def tg_fraction_of_ceiling(self) -> float:
        return statistics.mean(self.tg_tok_s) / self.ceiling_tok_s

    @property
    def pp_fraction_of_peak(self) -> float:
        return statistics.mean(self.pp_tok_s) * self.linear_flops_per_token / self.matmul_flops

    def summary(self) -> dict:
        def stat(values: list[float]) -> dict:
            return {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0, "runs": values}

        data = asdict(self)
        data.update(pp_tok_s=stat(self.pp_tok_s), tg_tok_s=stat(self.tg_tok_s), bytes_per_token=self.bytes_per_token,
                    ceiling_tok_s=self.ceiling_tok_s, tg_fraction_of_ceiling=self.tg_fraction_of_ceiling,
                    pp_fraction_of_peak=self.pp_fraction_of_peak)
        return data


def run_latency(config: LatencyConfig, progress: Callable[[str], None] = lambda _: None) -> list[LatencyResult]:
    unknown = set(config.weights) - set(WEIGHT_MODES)
    if unknown:
        raise RidgelineError(f"unknown --weights {', '.join(sorted(unknown))} (choose from {', '.join(WEIGHT_MODES)})")
    checkpoint = read_checkpoint(config.model)
    if config.prompt_tokens + config.gen_tokens > checkpoint.config.max_context:
        raise RidgelineError(f"-p + -n = {config.prompt_tokens + config.gen_tokens} exceeds the model's context of {checkpoint.config.max_context}")
    with torch_threads(config.threads):
        # The ceilings are this machine's cached measurement for the thread count (`ridgeline measure`), measured now
        # only where none is cached: the same roof as the dashboard's and roofline's, with its provenance.
        progress("reading this machine's read bandwidth and matmul FLOP/s (measured now where none is cached)")
        machine = this_machine(threads=torch.get_num_threads())
        bandwidth, rates = machine.bandwidth, machine.dense_flops
        integer_weights = shape_from_checkpoint(checkpoint).integer_weights
        results = []
        for weights in config.weights:
            precision = matmul_precision(weights, integer_weights, rates)
            progress(f"loading the model with {weights} weights")
            # Matrices quantised in memory (`quantized`) or dequantised at load to bf16/f32; f32 activations.
            runner = assemble_model(checkpoint, ModelOptions(torch.device("cpu"), torch.float32, weights, config.lm_head),
                                    CACHE, num_blocks=_num_blocks(config)).runner
            result = _bench_model(runner, weights, config, bandwidth, rates[precision], progress)
            results.append(replace(result, napkin_weight_bytes=napkin_weight_bytes(checkpoint, weights),
                                   matmul_precision=precision, machine=machine.title))
            del runner
    return results


def matmul_precision(weights: str, integer_weights: bool, rates: dict[str, float]) -> str:
    """The precision a weight mode's prompt matmuls run in, for its pp % of peak: the roofline's rule
    (napkin.hardware.matmul_precision) for weights kept quantised; weights dequantised at load take a float GEMM,
    measured as bf16."""
    return hardware.matmul_precision(rates, weights == "quantized" and integer_weights, "bf16")


def _num_blocks(config: LatencyConfig) -> int:
    """Blocks of one sequence holding the prompt and every generated token."""
    return -(-(config.prompt_tokens + config.gen_tokens) // CACHE.block_size)


def _bench_model(runner: ModelRunner, weights: str, config: LatencyConfig, bandwidth: float, flops: float,
                 progress: Callable[[str], None]) -> LatencyResult:
    model, model_config = runner.model, runner.model.config
    tables = runner.kv_cache.group_tables(list(range(_num_blocks(config))))
    generator = torch.Generator().manual_seed(config.seed)
    prompt = torch.randint(0, model_config.vocab_size, (config.prompt_tokens,), generator=generator).tolist()

    def forward(ids: list[int], start: int, num_prompt_tokens: int | None) -> torch.Tensor:
        return runner.forward([ForwardChunk(ids, start, tables, num_prompt_tokens=num_prompt_tokens)])[0]

    def prefill() -> None:
        forward(prompt, 0, None)  # prompt rows: the compute-bound path

    def generate(steps: int, step_bytes: list[int] | None = None) -> None:
        token = prompt[0]
        for position in range(steps):  # generated rows: the memory-bound path
            token = argmax_rows(forward([token], position, 0))[0]  # the engine's greedy pick, numpy's argmax
            if step_bytes is not None:
                step_bytes.append(last_step_bytes(model, tokens=1).total)

    progress(f"{weights}: warming up")
    forward(prompt[: min(32, len(prompt))], 0, None)
    generate(2)
    pp, tg = [], []
    for repetition in range(config.repetitions):
        progress(f"{weights}: pp{config.prompt_tokens} / tg{config.gen_tokens}, run {repetition + 1} of {config.repetitions}")
        if config.prompt_tokens:
            pp.append(config.prompt_tokens / _seconds(prefill))
        if config.gen_tokens:
            tg.append(config.gen_tokens / _seconds(lambda: generate(config.gen_tokens)))
    linear_weights = sum(_weight_count(m) for name, m in model.named_modules() if "lm_head" not in name)
    steps = max(1, min(config.gen_tokens, 32))
    with _timed_linears(model) as linear_seconds:
        step_seconds = _seconds(lambda: generate(steps)) / steps
    # An MoE step's bytes depend on where its token was routed: count them over the same steps, untimed
    step_bytes: list[int] = []
    is_moe = any(isinstance(m, MixtureOfExperts) for m in model.modules())
    generate(steps if is_moe else 1, step_bytes)
    return LatencyResult(
        weights=weights, threads=torch.get_num_threads(),
        prompt_tokens=config.prompt_tokens, gen_tokens=config.gen_tokens, pp_tok_s=pp or [0.0], tg_tok_s=tg or [0.0],
        weight_bytes=_resident_weight_bytes(model),
        decode_weight_bytes=statistics.mean(step_bytes), napkin_weight_bytes=0.0,
        kv_bytes_per_step=bytes_per_token(model_config, CACHE) * config.gen_tokens / 2,
        read_bandwidth=bandwidth, matmul_flops=flops, linear_flops_per_token=2.0 * linear_weights,
        tg_step_ms=1e3 * step_seconds, tg_linear_ms=1e3 * linear_seconds[0] / steps,
    )  # fmt: skip


@contextmanager
def _timed_linears(model: torch.nn.Module):
    """Accumulate the wall time spent inside every linear layer's forward (a one-element list, in seconds)."""
    total = [0.0]
    linears = _outermost_linears(model)

    def timed(forward):
        def call(*args, **kwargs):
            start = time.perf_counter()
            y = forward(*args, **kwargs)
            total[0] += time.perf_counter() - start
            return y

        return call

    for module in linears:
        module.forward = timed(module.forward)
    try:
        yield total
    finally:
        for module in linears:
            del module.forward  # back to the class's forward


def _seconds(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _outermost_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every linear layer of the model (DenseLinear, QuantizedLinear, or a wrapper around one), once."""
    found: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer in found)
        if type(module).__name__.endswith("Linear") and not inside:
            found[name] = module
    return list(found.values())


def _weight_count(module: torch.nn.Module) -> int:
    if isinstance(module, QuantizedLinear):
        return module.in_features * module.out_features
    if isinstance(module, DenseLinear):
        return module.weight.numel()
    return 0


def napkin_weight_bytes(checkpoint: Checkpoint, weights: str) -> float:
    """The roofline's weight bytes for one decode token of this checkpoint, in the format the weights are held in
    (as stored for `quantized`; every parameter at 2 or 4 bytes when dequantised at load)."""
    shape = shape_from_checkpoint(checkpoint)
    if weights != "quantized":
        size = 2 if weights == "bf16" else 4
        shape = replace(shape, **{name: WeightGroup(group.params, group.params * size) for name, group in
                                  (("embedding", shape.embedding), ("lm_head", shape.lm_head), ("dense", shape.dense),
                                   ("experts", shape.experts))})
    return shape.weight_bytes_read(1)


def _resident_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer: what a decode step streams (the embedding gather reads one row)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())
