"""Where the time of a decode step goes, by part of the model, and the bandwidth each matmul reached.

Every module of interest gets its forward wrapped in a timer for the duration of a `StepProfiler` block; a part's
time is exclusive (a layer's time without the matmuls and norms inside it), so the parts add up to the model's
forward, and the engine step's remainder is everything outside the model (scheduling, sampling, detokenising,
building the batch's metadata). Matmuls are keyed by role (q/k/v, o, gate/up, down, LM head) and storage format,
with the bytes of weight each call streams, so time per part sets beside bandwidth reached:
GB/s = weight bytes read / time in the kernel call (its Python wrapper included, as a step pays it).

Where the layers run as compiled calls (model/layers/decode_layer.py) their matmuls, norms and attention are not
Python calls at all: the layers are then one part, and decode_step_profile.py --modules runs them module by module
(the same bits) to time each op on its own.

The wrappers cost ~1 µs a call (about 130 calls in a batch-1 step of Gemma 3 270M): the profiled step is that
much slower than an unprofiled one, and the report says by how much.
"""

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import nn

from ridgeline.model.layers.attention import PagedAttention
from ridgeline.model.layers.embedding import TokenEmbedding
from ridgeline.model.layers.linear import DenseLinear, PhaseAwareLinear
from ridgeline.model.layers.mlp import GatedMLP
from ridgeline.model.layers.norm import RMSNorm
from ridgeline.model.transformer import DecoderLayer, Transformer

MODEL = "model (glue: rope tables, residual adds, Python)"
# Layers that run as compiled calls (model/layers/decode_layer.py: one per step, or one per layer) are one part:
# their matmuls, norms and attention are not separate calls to time. On the module path this part is what each
# layer adds around its modules.
LAYERS = "decoder layers (compiled calls; on modules: residual adds)"
OUTSIDE = "outside the model (schedule, sample, detokenise, batch metadata)"
# The role of a matmul, from the last parts of its module name (SharedInputLinear stacks q/k/v and gate/up).
ROLES = {"qkv": "q/k/v", "o": "o", "gate_up": "gate/up", "down": "down", "lm_head": "LM head"}


@dataclass
class Part:
    seconds: float = 0.0
    calls: int = 0
    weight_bytes: int = 0  # bytes of weight streamed over all calls (matmuls only)

    @property
    def gb_per_s(self) -> float:
        return self.weight_bytes / self.seconds / 1e9 if self.seconds and self.weight_bytes else 0.0


@dataclass
class StepProfile:
    parts: dict[str, Part] = field(default_factory=lambda: defaultdict(Part))
    steps: int = 0
    step_seconds: float = 0.0  # engine steps (or bare forward passes) timed, in all

    def per_step(self) -> dict[str, Part]:
        """Each part's mean time, calls and bytes per step (an OUTSIDE part only if whole steps were timed)."""
        n = max(self.steps, 1)
        return {name: Part(part.seconds / n, round(part.calls / n), part.weight_bytes // n)
                for name, part in self.parts.items()}


def matmul_bytes(module: nn.Module) -> int:
    """Bytes of weight one call of this linear layer reads (quantised planes as held, or the dense matrix)."""
    if isinstance(module, PhaseAwareLinear):
        return module.quantized.nbytes
    if isinstance(module, DenseLinear):
        return module.weight.numel() * module.weight.element_size()
    return 0


def matmul_name(name: str, module: nn.Module) -> str:
    parts = name.split(".")
    role = next((ROLES[p] for p in reversed(parts) if p in ROLES), parts[-1])
    storage = (module.quantized.qtype.name if isinstance(module, PhaseAwareLinear)
               else str(module.weight.dtype).removeprefix("torch."))
    return f"{role} ({storage})"


def profiled_parts(model: nn.Module) -> dict[nn.Module, tuple[str, int]]:
    """The modules a profile times: name of the part each belongs to and the weight bytes a call reads."""
    parts: dict[nn.Module, tuple[str, int]] = {model: (MODEL, 0)}
    stack = model.fused_stack() if isinstance(model, Transformer) else None
    if stack is not None:  # all layers in one compiled call: what it takes is the layers' time (not a module)
        parts[stack] = (LAYERS, 0)
    for name, module in model.named_modules():
        if isinstance(module, (PhaseAwareLinear, DenseLinear)):
            parts[module] = (matmul_name(name, module), matmul_bytes(module))
        elif isinstance(module, PagedAttention):
            parts[module] = ("attention (qk-norm, rope, KV write, paged attention)", 0)
        elif isinstance(module, GatedMLP):
            parts[module] = ("gated activation", 0)
        elif isinstance(module, RMSNorm):
            parts[module] = ("RMS norms (+ residual adds)", 0)
        elif isinstance(module, DecoderLayer):
            parts[module] = (LAYERS, 0)
        elif isinstance(module, TokenEmbedding):
            parts[module] = ("embedding lookup", 0)
    return parts


class StepProfiler:
    """Times the parts of `model` while active: `with StepProfiler(model) as profile:` ... then `profile.steps`
    whole steps timed through `step()` (or bare forward passes, then no OUTSIDE part)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.profile = StepProfile()
        self._stack: list[float] = []  # time spent in children of each open call

    def __enter__(self) -> "StepProfiler":
        for module, (name, nbytes) in profiled_parts(self.model).items():
            module.forward = self._timed(module.forward, self.profile.parts[name], nbytes)
        return self

    def __exit__(self, *exc) -> None:
        for module in profiled_parts(self.model):
            del module.forward  # back to the class's forward

    def _timed(self, forward, part: Part, nbytes: int):
        stack = self._stack

        def call(*args, **kwargs):
            stack.append(0.0)
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                children = stack.pop()
                part.seconds += elapsed - children
                part.calls += 1
                part.weight_bytes += nbytes
                if stack:
                    stack[-1] += elapsed

        return call

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time one whole step around the model's forward: what the model's parts leave is OUTSIDE."""
        def model_seconds() -> float:
            return sum(part.seconds for name, part in self.profile.parts.items() if name != OUTSIDE)

        before = model_seconds()
        start = time.perf_counter()
        yield
        elapsed = time.perf_counter() - start
        inside = model_seconds() - before
        outside = self.profile.parts[OUTSIDE]
        outside.seconds += elapsed - inside
        outside.calls += 1
        self.profile.steps += 1
        self.profile.step_seconds += elapsed


def format_profile(profile: StepProfile, bandwidth: float, title: str) -> str:
    """A table: each part's ms per step and share, and for matmuls the bytes read, GB/s and % of `bandwidth`."""
    parts = profile.per_step()
    total = sum(part.seconds for part in parts.values())
    lines = [title,
             f"{'part':62} {'calls':>5} {'ms':>7} {'share':>6} {'MB read':>8} {'GB/s':>6} {'% of bw':>7}"]
    for name, part in sorted(parts.items(), key=lambda item: -item[1].seconds):
        if not part.calls:
            continue  # a part the step's path never called (the ops inside a compiled layer)
        row = f"{name:62} {part.calls:5} {part.seconds * 1e3:7.3f} {part.seconds / total:6.1%}"
        if part.weight_bytes:
            row += f" {part.weight_bytes / 1e6:8.2f} {part.gb_per_s:6.1f} {part.gb_per_s * 1e9 / bandwidth:7.0%}"
        lines.append(row)
    matmuls = [p for p in parts.values() if p.weight_bytes]
    read, seconds = sum(p.weight_bytes for p in matmuls), sum(p.seconds for p in matmuls)
    lines.append(f"{'all matmuls':62} {sum(p.calls for p in matmuls):5} {seconds * 1e3:7.3f} {seconds / total:6.1%} "
                 f"{read / 1e6:8.2f} {read / seconds / 1e9 if seconds else 0:6.1f} "
                 f"{read / seconds / bandwidth if seconds else 0:7.0%}")
    lines.append(f"{'step':62} {'':5} {total * 1e3:7.3f} {1:6.0%}   (measured read bandwidth "
                 f"{bandwidth / 1e9:.1f} GB/s; ceiling for the matmuls alone {read / bandwidth * 1e3:.2f} ms)")
    return "\n".join(lines)
