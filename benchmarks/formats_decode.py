"""Decode speed per GGUF weight type, with the bytes a token reads: the default model requantised by llama.cpp's own
quantiser into each type ridgeline keeps quantised, then `bench latency` on each, beside llama.cpp on the same file.

    .venv/bin/python benchmarks/formats_decode.py [--types Q4_0,Q4_1,...] [--threads 2] [--repetitions 3] [--json]
    .venv/bin/python benchmarks/formats_decode.py --synthetic-llama [--types Q2_K,Q4_0,Q4_K_M] ...

The files are written once into benchmarks/.formats/ by llama-cpp-python's `llama_model_quantize` (the code behind
`llama-quantize`, with --allow-requantize: the only model bundled is already Q4_K_M, so every file's weights went
through Q4_K_M first; that costs accuracy, not speed, and speed and bytes are what this measures). Tensors whose
rows a type cannot split (Gemma 3 270M's 640-wide rows are not a multiple of a K-quant's 256) get llama.cpp's own
fallback type, so a file is a mix: `bytes/token` says what a decode step really reads, and each row counts the layer
matrices in the file by type.
--synthetic-llama measures instead a random-weight llama model whose matrices are all multiples of 256 wide
(benchmarks/synthetic_llama.py: TinyLlama 1.1B's shape with 8 layers, written once as f16 from a fixed seed), so that
llama.cpp's K-quant mixes keep their K-quant tensors (Q2_K among them); its files are quantised from the f16 one.
Each row: tg (one-token steps from an empty cache, as `llama-bench`) and pp for both engines, in one run under
/tmp/ridgeline-cpu.lock. Measured and printed, not asserted.
"""

import argparse
import fcntl
import json
import statistics
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from bench_vs_llamacpp import run_llamacpp
from llamacpp_env import CPU_LOCK, llamacpp_python
from synthetic_llama import layer_matrix_types, synthetic_llama_file

from ridgeline.bench.bench_latency import LatencyConfig, run_latency
from ridgeline.model.checkpoint import resolve_model_path

HERE = Path(__file__).resolve().parent
FILES = HERE / ".formats"
# The ftype names of llama.cpp's quantiser; the stored file is kept as it came (Q4_K_M).
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")
SYNTHETIC_TYPES = ("Q2_K", "Q4_0", "Q4_K_M")  # the type the bundled model cannot hold, and two references

QUANTIZE = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.allow_requantize = True
params.nthread = 2
if llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params) != 0:
    sys.exit("llama_model_quantize failed")
"""


def quantised_file(python: Path, source: Path, ftype: str, stored: str | None) -> Path:
    """`source` in llama.cpp's `ftype` mix; `stored`: the mix `source` already is (used as it is)."""
    if ftype == stored:
        return source
    target = FILES / f"{source.stem.removesuffix('.F16')}.{ftype}.gguf"
    if not target.exists():
        FILES.mkdir(exist_ok=True)
        partial = target.with_suffix(".partial")
        subprocess.run([str(python), "-c", QUANTIZE, str(source), str(partial), ftype], check=True,
                       capture_output=True)
        partial.rename(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default=None, help="llama.cpp ftype names, comma-separated (default: every type "
                        "ridgeline reads; with --synthetic-llama: " + ",".join(SYNTHETIC_TYPES) + ")")
    parser.add_argument("--synthetic-llama", action="store_true",
                        help="measure the random-weight llama model of synthetic_llama.py, not the bundled Gemma 3 270M")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("-p", "--prompt-tokens", type=int, default=128)
    parser.add_argument("-n", "--gen-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    python = llamacpp_python()
    types = args.types or ",".join(SYNTHETIC_TYPES if args.synthetic_llama else TYPES)
    rows = []
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = _now()
        if args.synthetic_llama:
            source, stored = synthetic_llama_file(FILES), "F16"
        else:
            source, stored = resolve_model_path(None), "Q4_K_M"
        for ftype in types.split(","):
            model = quantised_file(python, source, ftype, stored)
            config = LatencyConfig(str(model), args.prompt_tokens, args.gen_tokens, args.threads, args.repetitions,
                                   ("quantized",))
            ours = run_latency(config)[0]
            theirs = run_llamacpp(python, model, args)
            row = {"type": ftype, "file_mb": model.stat().st_size / 1e6, "bytes_per_token_mb": ours.bytes_per_token / 1e6,
                   "tg_tok_s": statistics.mean(ours.tg_tok_s), "llamacpp_tg_tok_s": statistics.mean(theirs["tg_tok_s"]),
                   "pp_tok_s": statistics.mean(ours.pp_tok_s), "llamacpp_pp_tok_s": statistics.mean(theirs["pp_tok_s"]),
                   "ceiling_tok_s": ours.ceiling_tok_s, "fraction_of_ceiling": ours.tg_fraction_of_ceiling,
                   "layer_matrix_types": layer_matrix_types(model)}
            rows.append(row)
            if not args.json:
                print(f"{ftype:7} {row['file_mb']:6.0f} MB file, {row['bytes_per_token_mb']:6.1f} MB/token | tg "
                      f"{row['tg_tok_s']:6.1f} vs llama.cpp {row['llamacpp_tg_tok_s']:6.1f} "
                      f"({row['tg_tok_s'] / row['llamacpp_tg_tok_s']:.2f}x; {row['fraction_of_ceiling']:.0%} of the "
                      f"{row['ceiling_tok_s']:.0f} tok/s ceiling) | pp{args.prompt_tokens} {row['pp_tok_s']:6.0f} vs "
                      f"{row['llamacpp_pp_tok_s']:6.0f} | layer matrices "
                      + ", ".join(f"{name} x{count}" for name, count in row["layer_matrix_types"].items()), flush=True)
        finished = _now()
    if args.json:
        print(json.dumps({"model": source.name, "started": started, "finished": finished, "threads": args.threads,
                          "repetitions": args.repetitions, "prompt_tokens": args.prompt_tokens,
                          "gen_tokens": args.gen_tokens, "rows": rows}, indent=2))


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


if __name__ == "__main__":
    main()
