"""Numbers from a model file's metadata, checked for type and range: a file may say anything under a known key."""

import math
from numbers import Integral, Real

from ridgeline.errors import ModelLoadError

MAX_COUNT = 2**31 - 1  # sizes beyond this overflow the int32 indices kernels and torch use
# The deepest public models have ~130 layers; per-layer tuples are built from this count before any tensor
# is looked at, so a claim of 2**31 layers must stop here.
MAX_LAYERS = 4096


def metadata_int(key: str, value: object, low: int = 1, high: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ModelLoadError(f"model metadata {key} should be an integer, not {_shown(value)}")
    if not low <= int(value) <= high:
        raise ModelLoadError(f"model metadata {key} = {int(value)} is out of range [{low}, {high}]")
    return int(value)


def metadata_float(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ModelLoadError(f"model metadata {key} should be a finite number, not {_shown(value)}")
    return float(value)


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
