"""Where start-up time goes: each phase is timed where it happens, and `serve` prints the sum as one line.

Phases nest (the kernels build while the weights are packed); a phase's figure leaves out the time of the
phases inside it, so the figures add up to the wall time they cover.
"""

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_spent: dict[str, float] = {}
_open: list[float] = []  # for each phase in progress, the time its nested phases took so far
_imported = time.perf_counter()


@contextmanager
def phase(name: str) -> Iterator[None]:
    _spent.setdefault(name, 0.0)  # listed in the order phases first start
    start = time.perf_counter()
    _open.append(0.0)
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        nested = _open.pop()
        _spent[name] += elapsed - nested
        if _open:
            _open[-1] += elapsed


def spent() -> dict[str, float]:
    """Seconds per phase since the process started (or since `reset`), in the order phases first ran."""
    return dict(_spent)


def reset() -> None:
    _spent.clear()


def process_seconds() -> float:
    """Seconds since this process started (Linux; elsewhere since this module was imported)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks since boot
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _imported


def describe(total: float) -> str:
    """One line: the phases, and what the rest of `total` seconds went to."""
    parts = [f"{name} {seconds:.2f} s" for name, seconds in _spent.items()]
    rest = total - sum(_spent.values())
    return f"start-up {total:.2f} s: " + ", ".join([*parts, f"other (imports, server set-up) {rest:.2f} s"])
