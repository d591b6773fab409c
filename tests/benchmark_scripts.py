"""The benchmark scripts as tests import them: benchmarks/ on the path, as `python benchmarks/x.py` has it."""

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def benchmark_module(name: str) -> Iterator[ModuleType]:
    """benchmarks/<name>.py imported, with benchmarks/ on sys.path while the block runs (its own imports of the
    scripts beside it resolve), and taken off after."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
