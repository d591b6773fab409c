"""llama.cpp's own q8_0 KV cache against its f16 KV, on the same model, text and windows as kv_cache_q8.py: the
figure to hold ridgeline's q8_0 KV to, measured on this model rather than quoted from another.

    python benchmarks/llamacpp_kv_kld.py [--contexts 512,4096] [--positions 2048] [--threads 2] [--json]

Runs inside the llama-cpp-python environment (benchmarks/llamacpp_env.py builds it). Windows and protocol as
kv_cache_q8.py: each window of --ctx tokens starts with BOS, is evaluated in ubatches of 512 tokens with logits at
every position (a later ubatch's queries read earlier keys back from the cache in its stored type), and each
position's next-token distribution is compared teacher-forced:
  KLD    KL(p_f16 || p_q8_0), as `llama-perplexity --kl-divergence` computes it;
  top-1  whether both caches put the same token first;
  PPL    of the text's next tokens, per cache type.
Flash attention is on for both (llama.cpp needs it for a quantised V cache). Measured and printed, not asserted.
"""

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "tests" / "data" / "reference" / "gpl-3.0.txt"
GGML_TYPE_F16, GGML_TYPE_Q8_0 = 1, 8
UBATCH = 512


def open_model(llama_cpp, model: str, ctx: int, threads: int, kv_type: int):
    options = dict(model_path=model, n_ctx=ctx, n_batch=UBATCH, n_ubatch=UBATCH, n_threads=threads,
                   n_threads_batch=threads, logits_all=True, type_k=kv_type, type_v=kv_type, verbose=False)
    if "flash_attn_type" in inspect.signature(llama_cpp.Llama).parameters:
        options["flash_attn_type"] = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
    else:
        options["flash_attn"] = True
    return llama_cpp.Llama(**options)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def evaluate(llm, window: list[int]) -> None:
    """Logits at every position of the window but the last (which has no target), left in llm.scores."""
    llm.reset()
    llm.eval(window[:-1])


SLICE = 256  # positions compared at a time: a 4,096-token window's logits are 4.3 GB per model in float32


def compare(models: dict, ids: list[int], bos: int, ctx: int, max_positions: int) -> dict:
    kld: list[np.ndarray] = []
    agree = positions = 0
    nll = {name: 0.0 for name in models}
    for start in range(0, len(ids) - ctx + 1, ctx):
        window = [bos] + ids[start + 1:start + ctx]
        targets = np.array(window[1:])
        for llm in models.values():
            evaluate(llm, window)
        for first in range(0, len(targets), SLICE):
            rows = slice(first, min(first + SLICE, len(targets)))
            logp = {name: log_softmax(llm.scores[rows]) for name, llm in models.items()}
            for name, values in logp.items():
                nll[name] -= values[np.arange(len(values)), targets[rows]].sum()
            kld.append(np.clip((np.exp(logp["f16"]) * (logp["f16"] - logp["q8_0"])).sum(-1), 0, None))
            agree += int((logp["f16"].argmax(-1) == logp["q8_0"].argmax(-1)).sum())
        positions += len(targets)
        print(f"  ctx {ctx}: {positions:,} positions, KLD so far {np.concatenate(kld).mean():.5f}", file=sys.stderr,
              flush=True)
        if positions >= max_positions:
            break
    values = np.concatenate(kld)
    ppl = {name: float(np.exp(total / positions)) for name, total in nll.items()}
    return {"positions": positions, "kld_q8_vs_f16_mean": float(values.mean()),
            "kld_q8_vs_f16_p99": float(np.quantile(values, 0.99)), "kld_q8_vs_f16_max": float(values.max()),
            "top1_agreement": agree / positions, "ppl": ppl, "ppl_change_q8_vs_f16": ppl["q8_0"] / ppl["f16"] - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled default model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", default="512,4096")
    parser.add_argument("--positions", type=int, default=2048, help="at least this many positions per context")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.model is None:  # the project's own environment knows where the default model lies
        sys.exit("--model is required inside the llama.cpp environment (run through kv_cache_q8.py --llamacpp)")
    import llama_cpp

    began = time.perf_counter()
    results = {"model": Path(args.model).name, "text": TEXT.name, "threads": args.threads,
               "llama_cpp_python": llama_cpp.__version__}
    for ctx in (int(c) for c in args.contexts.split(",")):
        models = {"f16": open_model(llama_cpp, args.model, ctx, args.threads, GGML_TYPE_F16),
                  "q8_0": open_model(llama_cpp, args.model, ctx, args.threads, GGML_TYPE_Q8_0)}
        tokens = models["f16"].tokenize(TEXT.read_text().encode(), add_bos=False, special=False)
        results[f"ctx_{ctx}"] = compare(models, tokens, models["f16"].token_bos(), ctx, args.positions)
        del models
    results["seconds"] = time.perf_counter() - began
    print(json.dumps(results, indent=2 if args.json else None))


if __name__ == "__main__":
    main()
