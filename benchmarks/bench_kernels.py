"""Microbenchmark of the quantised kernels: GB/s and GFLOP/s per GGUF type and row count, vs torch bf16 matmul.

For each type and activation row count M it times the int8 gemv (memory-bound path) and dequantise-to-bf16 +
GEMM (compute-bound path) on one weight matrix, beside torch's bf16 matmul on the same matrix already dense.
GB/s counts the weight bytes each path must read once (quantised planes, or the dense bf16 matrix); GFLOP/s is
2*M*out*in per call. The crossover column is where the GEMM path starts to win. The gemv's rate is also given as a
share of this machine's VPDPBUSD peak (the instruction its inner loop is made of), measured at the start of the
same run with the same threads (machine/measure.py: a shared machine's clock moves between runs).

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/bench_kernels.py [--threads 2] [--json]
"""

import argparse
import json
import time

import torch
from gguf import GGMLQuantizationType as T

from ridgeline.machine.measure import measure_instruction_peaks
from ridgeline.model.quant import kernels
from ridgeline.model.quant.packing import pack
from ridgeline.model.quant.random_blocks import random_stored

TYPES = (T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 512)
LM_HEAD = (262144, 640)  # the default model's tied embedding / LM head (Q8_0): the largest matrix of a decode step


def best_seconds(call, seconds: float = 0.3, min_repeats: int = 3) -> float:
    call()
    best, repeats, deadline = float("inf"), 0, time.perf_counter() + seconds
    while repeats < min_repeats or time.perf_counter() < deadline:
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
        repeats += 1
    return best


def share_of_peak(ops_per_s: float, peaks: dict[str, float] | None) -> float | None:
    """A gemv's rate as a share of the int8 dot-product peak (None without a peak: no compiled kernels)."""
    return ops_per_s / peaks["int8_ops_per_s"] if peaks else None


def bench_type(qtype: T, shape: tuple[int, int], rows: tuple[int, ...]) -> list[dict]:
    packed = pack(random_stored(qtype, shape))
    dense = kernels.dequantize(packed, torch.bfloat16)
    results = []
    for m in rows:
        x = torch.randn(m, shape[1])
        flops = 2 * m * shape[0] * shape[1]
        gemv = best_seconds(lambda: kernels.gemv(packed, x))
        gemm = best_seconds(lambda: torch.mm(x.bfloat16(), kernels.dequantize(packed, torch.bfloat16).T))
        bf16 = best_seconds(lambda: torch.mm(x.bfloat16(), dense.T))
        results.append({
            "type": qtype.name, "out": shape[0], "in": shape[1], "rows": m,
            "gemv_gb_s": packed.nbytes / gemv / 1e9, "gemv_gflop_s": flops / gemv / 1e9,
            "gemm_gflop_s": flops / gemm / 1e9, "torch_bf16_gb_s": dense.numel() * 2 / bf16 / 1e9,
            "torch_bf16_gflop_s": flops / bf16 / 1e9, "gemm_wins": gemm < gemv,
        })  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--shape", type=int, nargs=2, default=(2048, 640), help="out in (default: Gemma 3 270M's MLP)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if kernels.compiled() is None:
        print("compiled kernels unavailable here: timing the torch fallback")
    peaks = measure_instruction_peaks()
    results = []
    for qtype in TYPES:
        results += bench_type(qtype, tuple(args.shape), ROWS)
    results += bench_type(T.Q8_0, LM_HEAD, (1,))
    for r in results:
        r["gemv_share_of_int8_peak"] = share_of_peak(r["gemv_gflop_s"] * 1e9, peaks)
    if args.json:
        print(json.dumps({"instruction_peaks": peaks, "results": results}, indent=1))
        return
    print(f"threads={torch.get_num_threads()}  GB/s = weight bytes read once per call / time")
    if peaks:
        print(f"peaks, every thread busy: VPDPBUSD {peaks['int8_ops_per_s'] / 1e9:.0f} GOPS (int8), "
              f"FMA {peaks['fp32_flops_per_s'] / 1e9:.0f} GFLOP/s (fp32)")
    print(f"{'type':5} {'out x in':>12} {'M':>4} {'gemv GB/s':>9} {'gemv GF/s':>9} {'of peak':>7} {'deq+GEMM GF/s':>13} "
          f"{'bf16 GB/s':>9} {'bf16 GF/s':>9}")
    for r in results:
        share = "-" if r["gemv_share_of_int8_peak"] is None else f"{r['gemv_share_of_int8_peak']:.0%}"
        print(f"{r['type']:5} {r['out']:>6}x{r['in']:<5} {r['rows']:>4} {r['gemv_gb_s']:9.1f} {r['gemv_gflop_s']:9.1f} "
              f"{share:>7} {r['gemm_gflop_s']:13.1f} {r['torch_bf16_gb_s']:9.1f} {r['torch_bf16_gflop_s']:9.1f}")
    print("crossover (first M where dequantise+GEMM beats the gemv):")
    for qtype in TYPES:
        wins = [r["rows"] for r in results if r["type"] == qtype.name and r["gemm_wins"] and r["out"] == args.shape[0]]
        print(f"  {qtype.name}: {wins[0] if wins else '> ' + str(ROWS[-1])}")


if __name__ == "__main__":
    main()
