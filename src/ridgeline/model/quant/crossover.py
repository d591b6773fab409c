"""The measured row count from which dequantise-to-bf16 + GEMM beats the streaming int8 gemv, per GGUF type.

Below the crossover a step is memory-bound (the weight bytes dominate), above it compute-bound. It depends on
the CPU, the thread count and the kernels, so it is measured once (about a second per type) and cached in
~/.cache/ridgeline/crossover.json under a key naming all three.
"""

import hashlib
import json
import platform
import time

import torch
from gguf import GGMLQuantizationType

from ridgeline.model import native
from ridgeline.model.quant import kernels
from ridgeline.model.quant.packing import pack
from ridgeline.model.quant.random_blocks import random_stored
from ridgeline.startup_clock import phase

CANDIDATE_ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
PROBE_SHAPE = (2048, 1024)  # (out, in): an MLP-sized matrix that fits in L2+L3 like the model's do
_in_process: dict[str, int] = {}


def crossover_rows(qtype: GGMLQuantizationType) -> int:
    """Smallest row count at which the GEMM path is at least as fast as the gemv path on this machine."""
    key = f"{_machine_key()}:{qtype.name}"
    if key not in _in_process:
        path = native.CACHE_DIR / "crossover.json"
        cached = json.loads(path.read_text()) if path.exists() else {}
        if key not in cached:
            with phase("kernels"):  # measuring is part of what a first start spends on the kernels
                cached[key] = measure_crossover(qtype)["crossover"]
            path.parent.mkdir(parents=True, exist_ok=True)
            fresh = json.loads(path.read_text()) if path.exists() else {}  # another process may have written
            path.write_text(json.dumps(fresh | {key: cached[key]}, indent=1))
        _in_process[key] = cached[key]
    return _in_process[key]


def measure_crossover(qtype: GGMLQuantizationType, shape: tuple[int, int] = PROBE_SHAPE, timer=None) -> dict:
    """Seconds per call of both paths for each candidate row count, and the crossover they imply.

    The GEMM must win at two candidate row counts in a row, and the first of them is the crossover. One win
    alone can be a burst of other work during the gemv's timings: on a machine installing packages beside it, a
    single such sample once put Q5_0's crossover at 2 rows. The result is cached for good, so every prompt row
    then ran through dequantise + GEMM and a served burst ran at ~60 % of its speed. `timer(call) -> seconds`
    replaces the best-of-5 timing (tests)."""
    timer = timer or _best_of
    weight = pack(random_stored(qtype, shape))
    gemv_seconds, gemm_seconds = [], []
    crossover = CANDIDATE_ROWS[-1] + 1  # unless the GEMM wins somewhere below, the gemv is used throughout
    won_at = None  # the row count of an unconfirmed GEMM win
    for rows in CANDIDATE_ROWS:
        x = torch.randn(rows, shape[1])
        gemv_seconds.append(timer(lambda: kernels.gemv(weight, x)))
        gemm_seconds.append(timer(lambda: torch.mm(x.bfloat16(), kernels.dequantize(weight, torch.bfloat16).T)))
        if gemm_seconds[-1] > gemv_seconds[-1]:
            won_at = None
        elif won_at is not None or rows == CANDIDATE_ROWS[-1]:
            crossover = won_at or rows
            break  # the GEMM's cost is nearly flat in rows from here while the gemv's keeps growing
        else:
            won_at = rows
    measured = CANDIDATE_ROWS[: len(gemv_seconds)]
    return {"rows": list(measured), "gemv_s": gemv_seconds, "gemm_s": gemm_seconds, "crossover": crossover}


def _best_of(call, repeats: int = 5) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def _machine_key() -> str:
    # The kernels' source, the probed row counts and the rule that reads them name the measurement: change any
    # and it is redone (so a crossover cached by the old single-win rule is measured again).
    probe = repr((CANDIDATE_ROWS, "confirmed by two GEMM wins in a row")).encode()
    source_hash = hashlib.sha256((native.CSRC / "quant_kernels.cpp").read_bytes() + probe).hexdigest()[:12]
    return f"{platform.processor() or platform.machine()}:{_cpu_model()}:threads={torch.get_num_threads()}:{source_hash}"


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown-cpu"
