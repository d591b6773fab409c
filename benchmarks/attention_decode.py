"""The paged attention kernel alone, at a decode step's shape: time against the bandwidth its K and V reads need.

    .venv/bin/python benchmarks/attention_decode.py [--rows 32] [--keys 300] [--layers 18] [--threads 2] [--json FILE]

One call per layer, as a decode step makes them: `--rows` sequences, each one query row over `--keys` keys, with
Gemma 3 270M's heads by default (4 query heads on 1 KV head of 256 values, bf16 pages of 16 tokens). Each layer has
its own cache, so K and V come from DRAM as they do in the engine. The pages of a sequence are either scattered
over the cache (what a long-running server's block tables look like) or consecutive. Beside the times: the KV
bytes a step reads, the GB/s that makes, and the read bandwidth measured in the same run (machine/measure.py).
Runs under /tmp/ridgeline-cpu.lock.
"""

import argparse
import fcntl
import json
import statistics
import time

import torch

from ridgeline.machine.measure import measure_read_bandwidth
from ridgeline.model.native import NO_TENSOR, compiled

from llamacpp_env import CPU_LOCK  # noqa: E402 - the one lock every benchmark takes

BLOCK_SIZE = 16


def decode_step_inputs(rows: int, keys: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                       scattered: bool, seed: int = 0) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Per-layer (K, V) caches twice the size the rows need, block tables into them, and the query rows."""
    generator = torch.Generator().manual_seed(seed)
    pages_per_row = -(-keys // BLOCK_SIZE)
    pages = 2 * rows * pages_per_row
    caches = [tuple(torch.randn(pages * BLOCK_SIZE, kv_heads, head_dim, generator=generator).bfloat16()
                    for _ in range(2)) for _ in range(layers)]
    order = torch.randperm(pages, generator=generator) if scattered else torch.arange(pages)
    tables = order[: rows * pages_per_row].int().view(rows, pages_per_row).contiguous()
    queries = torch.randn(rows, heads, head_dim, generator=generator)
    return caches, tables, queries


def time_decode_step(rows: int, keys: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                     scattered: bool, repeats: int) -> list[float]:
    """Seconds of `repeats` steps, each one paged_attention call per layer."""
    kernels = compiled()
    caches, tables, queries = decode_step_inputs(rows, keys, layers, heads, kv_heads, head_dim, scattered)
    row_seq = torch.arange(rows, dtype=torch.int32)
    key_begin = torch.zeros(rows, dtype=torch.int32)
    key_end = torch.full((rows,), keys, dtype=torch.int32)

    def step() -> None:
        for k_cache, v_cache in caches:
            kernels.paged_attention(queries, k_cache, NO_TENSOR, v_cache, NO_TENSOR, tables, row_seq, key_begin,
                                    key_end, BLOCK_SIZE, head_dim ** -0.5, NO_TENSOR)

    for _ in range(3):
        step()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return seconds


def shape_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the step's shape for the kernel, in words; None where it can run."""
    for name in ("rows", "keys", "layers", "heads", "kv_heads", "head_dim", "threads", "repeats"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
    if args.head_dim % 32:
        return f"--head-dim must be a multiple of 32 (the kernel reads 32 values at a time), got {args.head_dim}"
    if args.heads % args.kv_heads:
        return f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32, help="decode rows (sequences) in the step")
    parser.add_argument("--keys", type=int, default=300, help="keys each row attends to")
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=60, help="timed steps per page layout")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    if problem := shape_problem(args):
        parser.error(problem)
    if compiled() is None:
        raise SystemExit("attention_decode: the compiled kernels are not available on this machine")
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        torch.set_num_threads(args.threads)
        bandwidth = measure_read_bandwidth(args.threads)
        kv_bytes = 2 * args.layers * args.rows * args.keys * args.kv_heads * args.head_dim * 2
        results = []
        for scattered in (True, False):
            seconds = time_decode_step(args.rows, args.keys, args.layers, args.heads, args.kv_heads, args.head_dim,
                                       scattered, args.repeats)
            median = statistics.median(seconds)
            results.append({"pages": "scattered" if scattered else "consecutive", "median_ms": median * 1e3,
                            "best_ms": min(seconds) * 1e3, "kv_gb_per_s": kv_bytes / median / 1e9})
    print(f"paged attention, decode step: {args.rows} rows x {args.keys} keys x {args.layers} layers, "
          f"{kv_bytes / 1e6:.0f} MB of bf16 K and V; read bandwidth {bandwidth / 1e9:.1f} GB/s, {args.threads} threads")
    print(f"{'pages':<12} {'median ms':>10} {'best ms':>8} {'KV GB/s':>8} {'% of bw':>8}")
    for result in results:
        print(f"{result['pages']:<12} {result['median_ms']:>10.2f} {result['best_ms']:>8.2f} "
              f"{result['kv_gb_per_s']:>8.1f} {100 * result['kv_gb_per_s'] * 1e9 / bandwidth:>7.0f}%")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "read_bandwidth_gb_per_s": bandwidth / 1e9, "kv_mb": kv_bytes / 1e6,
                       "results": results}, out, indent=2)


if __name__ == "__main__":
    main()
