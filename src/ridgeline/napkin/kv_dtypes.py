"""The KV-cache element types and what each costs in bytes: the one table the engine's cache, its capacity report,
the KV handoff's page size, the roofline and the simulator all read.

Here in napkin/ (plain arithmetic, no torch) so the roofline and advise tools can price a q8_0 cache without the
engine. Q8_0 is llama.cpp's block: 32 int8 values sharing one fp16 scale, 34 bytes per 32 values, so a q8_0 cache
holds 2 / 1.0625 = 1.88x the tokens of a bf16 one.
"""

from dataclasses import dataclass

from ridgeline.errors import RidgelineError


@dataclass(frozen=True)
class KVDtype:
    name: str
    value_bytes: int  # bytes of one stored value
    block: int = 1  # values sharing one scale (1: a plain float, no scale)
    scale_bytes: int = 0

    @property
    def bytes_per_value(self) -> float:
        return self.value_bytes + self.scale_bytes / self.block


KV_DTYPES = {d.name: d for d in (KVDtype("bf16", 2), KVDtype("fp16", 2), KVDtype("fp32", 4),
                                 KVDtype("q8_0", 1, block=32, scale_bytes=2))}


def kv_dtype(name: str) -> KVDtype:
    if name not in KV_DTYPES:
        raise RidgelineError(f"unknown KV cache dtype {name!r} (choose from {', '.join(KV_DTYPES)})")
    return KV_DTYPES[name]


def kv_bytes_per_value(key: str, value: str) -> float:
    """Bytes per cached element averaged over K and V (half the elements each): the `kv_dtype_bytes` figure the
    roofline and the simulator multiply by 2 x kv_heads x head_dim x layers."""
    return (kv_dtype(key).bytes_per_value + kv_dtype(value).bytes_per_value) / 2


def parse_kv_bytes(text: str) -> float:
    """The roofline's and simulator's --kv-bytes: a KV dtype's name (q8_0 -> 1.0625) or bytes per element."""
    if text in KV_DTYPES:
        return KV_DTYPES[text].bytes_per_value
    try:
        value = float(text)
    except ValueError:
        raise RidgelineError(f"--kv-bytes takes bytes per element or a KV dtype ({', '.join(KV_DTYPES)}), "
                             f"not {text!r}") from None
    if not value > 0:
        raise RidgelineError(f"--kv-bytes must be positive, not {text!r}")
    return value
