"""Every benchmark script imports: a module moved out from under one (token_budget.py imported `served` after it
became ridgeline.bench.served) shows here, not on the day someone runs the benchmark.

Each script is imported in a subprocess of its own with benchmarks/ on the path, as `python benchmarks/x.py` has
it, and without running its main(). The three that run inside llama-cpp-python's own environment are left out.
"""

import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS

IN_PEER_ENVIRONMENT = {"llamacpp_worker.py", "lmeval_llamacpp_scores.py", "record_llamacpp_reference.py"}  # import llama_cpp
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in IN_PEER_ENVIRONMENT)


def test_the_benchmarks_are_found():
    assert "token_budget.py" in SCRIPTS and "serve_vs_vllm.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_imports(script):
    code = f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); sys.argv = ['x']; import {script[:-3]}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
