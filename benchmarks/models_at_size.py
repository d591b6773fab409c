"""ridgeline vs llama.cpp on a catalogued model shape at full size (issue 40): a random-weight GGUF written by
`ridgeline synth`, the same file for both engines, 2 threads, every comparison interleaved.

    PYTHONPATH=src python benchmarks/models_at_size.py [--shape qwen2.5-1.5b] [--weights q4_k_m] [--rounds 3]

- speed: `ridgeline bench latency` vs `llama-bench`, pp512 and tg128, one repetition per round, the order
  alternating (R L, L R, R L, ...); medians of the rounds. Peak RSS of each process (its own rusage).
- start-up: process start -> first token, page cache warm: `ridgeline generate -n 1` vs `llama-bench -p 0 -n 1
  --no-warmup -r 1` (llama-bench, not a chat tool: the only llama.cpp binary built here, and it loads the model,
  makes a context and decodes one token, which is what is timed), interleaved the same way; medians.
- agreement: ridgeline's next-token logits at 64 positions of a real text vs llama-cpp-python's (`logits_all`)
  on the same file: top-1 agreement and mean KL(llama.cpp || ridgeline).
Each run's figures go to benchmarks/results/models_at_size/<shape>-<weights>.json. The whole run holds
/tmp/ridgeline-cpu.lock so no other benchmark shares the CPUs.
"""

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from llamacpp_env import CPU_LOCK, llamacpp_python
from llamacpp_tools import llama_bench

from ridgeline.model.synth.writer import SynthOptions, cache_dir, synth_file

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "models_at_size"
TEXT = ROOT / "tests" / "data" / "reference" / "gpl-3.0.txt"
RIDGELINE = [sys.executable, "-c", "from ridgeline.cli import main; main()"]
LOGITS_WORKER = r"""
import sys, numpy as np, llama_cpp
model, ids_path, out_path, threads = sys.argv[1:5]
ids = np.load(ids_path).tolist()
llm = llama_cpp.Llama(model_path=model, n_ctx=len(ids) + 8, n_batch=len(ids), n_ubatch=len(ids), n_threads=int(threads),
                      n_threads_batch=int(threads), logits_all=True, verbose=False)
llm.eval(ids)
np.save(out_path, np.array(llm.scores[:len(ids)], dtype=np.float32))
"""


def run_with_rss(command: list) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in bytes (from wait4, this child alone) and stdout."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen([str(part) for part in command], stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if process.returncode:
            raise RuntimeError(f"{command[:3]} failed ({process.returncode}): {err.read()[-2000:]}")
        return seconds, usage.ru_maxrss * 1024, out.read()


def ridgeline_latency(model: Path, args) -> dict:
    seconds, rss, out = run_with_rss([*RIDGELINE, "bench", "latency", "--model", model, "--weights", "quantized",
                                      "-p", args.prompt_tokens, "-n", args.gen_tokens, "--threads", args.threads,
                                      "-r", 1, "--json"])
    (result,) = json.loads(out)
    return {"pp_tok_s": result["pp_tok_s"]["mean"], "tg_tok_s": result["tg_tok_s"]["mean"], "peak_rss": rss,
            "read_bandwidth": result["read_bandwidth"], "bytes_per_token": result["bytes_per_token"],
            "ceiling_tok_s": result["ceiling_tok_s"], "seconds": seconds}


def llamacpp_latency(binary: Path, model: Path, args) -> dict:
    seconds, rss, out = run_with_rss([binary, "-m", model, "-p", args.prompt_tokens, "-n", args.gen_tokens,
                                      "-t", args.threads, "-r", 1, "-o", "json"])
    rates = {("tg_tok_s" if test["n_gen"] else "pp_tok_s"): float(test["avg_ts"]) for test in json.loads(out)}
    return {**rates, "peak_rss": rss, "seconds": seconds}


def ridgeline_first_token(model: Path, args) -> float:
    seconds, _, _ = run_with_rss([*RIDGELINE, "generate", "--model", model, "-n", 1, "-t", 0, "--threads",
                                  args.threads, "Hello"])
    return seconds


def llamacpp_first_token(binary: Path, model: Path, args) -> float:
    seconds, _, _ = run_with_rss([binary, "-m", model, "-p", 0, "-n", 1, "-r", 1, "--no-warmup", "-t", args.threads])
    return seconds


def interleaved(rounds: int, ours, theirs) -> tuple[list, list]:
    """R L, L R, R L, ...: each engine goes first in alternate rounds, so drift over minutes hits both alike."""
    a, b = [], []
    for i in range(rounds):
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            (a if which == 0 else b).append(ours() if which == 0 else theirs())
    return a, b


def agreement(model: Path, python: Path, positions: int, threads: int) -> dict:
    import torch

    from ridgeline.engine.assemble import assemble_model
    from ridgeline.engine.kv_cache import KVCacheConfig
    from ridgeline.model.attention_batch import ForwardChunk
    from ridgeline.model.checkpoint import read_checkpoint
    from ridgeline.model.transformer import ModelOptions

    torch.set_num_threads(threads)
    checkpoint = read_checkpoint(str(model))
    tokenizer = checkpoint.load_tokenizer()
    ids = tokenizer.encode(TEXT.read_text(), add_bos=False)[:positions]
    runner = assemble_model(checkpoint, ModelOptions(weights="quantized"), KVCacheConfig(block_size=16, dtype="fp32"),
                            num_blocks=-(-positions // 16)).runner
    with torch.no_grad():
        ours = runner.run([ForwardChunk(ids, 0, runner.kv_cache.group_tables(list(range(-(-positions // 16)))),
                                        all_logits=True)])[0].float().numpy()
    with tempfile.TemporaryDirectory() as work:
        np.save(f"{work}/ids.npy", np.array(ids, np.int64))
        subprocess.run([python, "-c", LOGITS_WORKER, model, f"{work}/ids.npy", f"{work}/theirs.npy", str(threads)],
                       check=True)
        theirs = np.load(f"{work}/theirs.npy")

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    p, q = log_softmax(theirs), log_softmax(ours)
    kld = (np.exp(p) * (p - q)).sum(axis=-1)
    return {"positions": len(ids), "top1_agreement": float((theirs.argmax(-1) == ours.argmax(-1)).mean()),
            "mean_kld": float(kld.mean()), "max_kld": float(kld.max()),
            "finite": bool(np.isfinite(ours).all())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--weights", default="q4_k_m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-p", "--prompt-tokens", type=int, default=512)
    parser.add_argument("-n", "--gen-tokens", type=int, default=128)
    parser.add_argument("--positions", type=int, default=64, help="positions compared for top-1 / KLD (0 skips)")
    args = parser.parse_args()
    binary = llama_bench()  # built first if needed (each takes the CPU lock itself)
    python = llamacpp_python() if args.positions else None
    options = SynthOptions(args.shape, args.weights)
    model = synth_file(cache_dir(), options)
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ours, theirs = interleaved(args.rounds, lambda: ridgeline_latency(model, args),
                                   lambda: llamacpp_latency(binary, model, args))
        start_ours, start_theirs = interleaved(args.rounds, lambda: ridgeline_first_token(model, args),
                                               lambda: llamacpp_first_token(binary, model, args))
        agree = agreement(model, python, args.positions, args.threads) if args.positions else None

    def median(rows: list[dict], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    summary = {
        "shape": args.shape, "weights": args.weights, "file": model.name, "file_bytes": model.stat().st_size,
        "threads": args.threads, "rounds": args.rounds, "order": "R L, L R, R L, ... (medians of the rounds)",
        "ridgeline": {"rounds": ours, "first_token_s": start_ours},
        "llama_cpp": {"rounds": theirs, "first_token_s": start_theirs, "tool": "llama-bench"},
        "median": {
            f"pp{args.prompt_tokens}": [median(ours, "pp_tok_s"), median(theirs, "pp_tok_s")],
            f"tg{args.gen_tokens}": [median(ours, "tg_tok_s"), median(theirs, "tg_tok_s")],
            "peak_rss_bytes": [median(ours, "peak_rss"), median(theirs, "peak_rss")],
            "first_token_s": [statistics.median(start_ours), statistics.median(start_theirs)],
            "tg_ceiling_tok_s (ridgeline's bandwidth / bytes per token)": median(ours, "ceiling_tok_s"),
        },
        "agreement_vs_llama_cpp_python": agree,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.shape}-{args.weights}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    m = summary["median"]
    print(f"{model.name} ({model.stat().st_size / 1e9:.2f} GB), {args.threads} threads, {args.rounds} interleaved rounds")
    for key in (f"pp{args.prompt_tokens}", f"tg{args.gen_tokens}"):
        print(f"{key:12} ridgeline {m[key][0]:8.1f}  llama.cpp {m[key][1]:8.1f}  {m[key][0] / m[key][1]:.2f}x")
    print(f"peak RSS     ridgeline {m['peak_rss_bytes'][0] / 1e9:6.2f} GB  llama.cpp {m['peak_rss_bytes'][1] / 1e9:6.2f} GB")
    print(f"start->tok   ridgeline {m['first_token_s'][0]:6.2f} s   llama.cpp {m['first_token_s'][1]:6.2f} s")
    if agree:
        print(f"agreement    top-1 {agree['top1_agreement']:.1%}, mean KLD {agree['mean_kld']:.4f} over {agree['positions']} positions")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
