"""benchmarks/bench_vs_llamacpp.py reads llama-bench's JSON: each repetition's rate lands under pp or tg."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_vs_llamacpp import llama_bench_rates  # noqa: E402


def test_llama_bench_json_gives_each_repetitions_rate_by_test():
    # the shape of `llama-bench -o json`: one object per test (trimmed to the fields read)
    tests = [
        {"build_commit": "abc123", "n_prompt": 512, "n_gen": 0, "avg_ts": 410.0, "samples_ts": [400.0, 420.0]},
        {"build_commit": "abc123", "n_prompt": 0, "n_gen": 128, "avg_ts": 75.5, "samples_ts": [75.0, 76.0]},
    ]
    rates = llama_bench_rates(tests)
    assert rates == {"pp_tok_s": [400.0, 420.0], "tg_tok_s": [75.0, 76.0], "llama_bench_build": "abc123"}
