"""8-bit (q8_0) KV cache against bf16 KV on the default model: accuracy, capacity and decode speed.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/kv_cache_q8.py [--threads 2] [--llamacpp] [--json]
        [--attention torch|compiled] [--decode-only]

One model, one KV cache per type (bf16, q8_0, fp16 as llama.cpp's own baseline, and fp32 as the floor bf16 and fp16
themselves are measured against), all fed the
same windows of tests/data/reference/gpl-3.0.txt. Each window of --ctx tokens is prefilled in chunks of --chunk
tokens with logits at every position, so each chunk's queries read every earlier key back from the cache in its
stored (quantised) form, as a long prompt and every later decode step does. Per position, teacher-forced:
  KLD    KL(p_bf16 || p_q8) of the next-token distributions, and KL(p_fp16 || p_q8) (llama.cpp's
         `llama-perplexity --kl-divergence` reports ~0.001 for q8_0 K+V against f16 on larger models);
  top-1  whether both caches put the same token first;
  PPL    perplexity of the text's next tokens over all positions, per cache type.
Capacity: sequences of 4,096 tokens that the default 2 GiB budget holds per type (the serve start-up arithmetic).
By default every type's accuracy is measured on the torch attention path (see torch_attention_for_all);
--attention compiled measures each on the compiled kernel instead, which is where q8_0 and bf16 run in use.
Decode: one-token forward steps at the longest context (the model forward, no sampler), bf16 and q8_0 alternating
step by step so both see the same machine load; median tok/s. Both run their own path: the compiled kernel (it
reads Q8_0 pages in place) where the kernels build, else torch. --decode-only skips the accuracy part.
Measured and printed, not asserted.
--llamacpp then measures llama.cpp's own q8_0 KV against its f16 KV on the same model, text and windows
(benchmarks/llamacpp_kv_kld.py, in the llama-cpp-python environment), so the target is read off this model.
"""

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

import ridgeline.model.layers.attention as attention_layer
import ridgeline.model.layers.attention_kernel as attention_kernel
from ridgeline.engine.assemble import assemble_model
from ridgeline.engine.kv_cache import KVCache, KVCacheConfig, pages_for_budget, pages_per_sequence
from ridgeline.engine.model_runner import ModelRunner
from ridgeline.model.attention_batch import ForwardChunk
from ridgeline.model.native import compiled, on_compiled_path

TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "reference" / "gpl-3.0.txt"
TYPES = ("bf16", "fp16", "q8_0", "fp32")
DECODE_STEPS = 24


class Tally:
    """Running sums over positions for one context length."""

    def __init__(self):
        self.positions = self.agree = 0
        self.kld: list[torch.Tensor] = []
        self.kld_fp16: list[torch.Tensor] = []  # q8_0 against fp16, llama.cpp's baseline type
        self.kld_fp32: list[torch.Tensor] = []  # bf16 against fp32: how far bf16 KV itself is from exact
        self.nll = {name: 0.0 for name in TYPES}

    def add(self, logits: dict[str, torch.Tensor], targets: torch.Tensor) -> None:
        logp = {name: torch.log_softmax(rows.float(), dim=-1) for name, rows in logits.items()}
        for name in TYPES:
            self.nll[name] -= logp[name].gather(1, targets[:, None]).double().sum().item()
        self.kld.append(kl(logp["bf16"], logp["q8_0"]))
        self.kld_fp16.append(kl(logp["fp16"], logp["q8_0"]))
        self.agree += (logp["bf16"].argmax(-1) == logp["q8_0"].argmax(-1)).sum().item()
        self.positions += len(targets)
        self.kld_fp32.append(kl(logp["fp32"], logp["bf16"]))

    def summary(self) -> dict:
        kld, floor, kld_fp16 = torch.cat(self.kld), torch.cat(self.kld_fp32), torch.cat(self.kld_fp16)
        ppl = {name: float(torch.tensor(total / self.positions).exp()) for name, total in self.nll.items()}
        return {"positions": self.positions, "kld_q8_vs_bf16_mean": kld.mean().item(),
                "kld_q8_vs_bf16_p99": kld.quantile(0.99).item(), "kld_q8_vs_bf16_max": kld.max().item(),
                "kld_q8_vs_fp16_mean": kld_fp16.mean().item(), "kld_q8_vs_fp16_p99": kld_fp16.quantile(0.99).item(),
                "kld_bf16_vs_fp32_mean": floor.mean().item(), "top1_agreement": self.agree / self.positions,
                "ppl": ppl, "ppl_change_q8_vs_bf16": ppl["q8_0"] / ppl["bf16"] - 1}


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    return (logp.exp() * (logp - logq)).sum(-1).clamp(min=0)


def torch_attention_for_all(on: bool) -> None:
    """The accuracy runs put every KV type on the torch attention path by default (as q8_0 was, before the kernel
    read Q8_0 pages), so the figures stay comparable with the earlier ones: on this machine the compiled kernel and
    the torch path differ by KLD ~0.003 even with fp32 KV (measured; a question for the kernel rework)."""
    attention_layer.on_compiled_path = (lambda *_, **__: False) if on else on_compiled_path
    attention_kernel.compiled = (lambda: None) if on else compiled


def compare(runners: dict[str, ModelRunner], ids: list[int], bos: int, ctx: int, chunk: int,
            max_positions: int) -> dict:
    tally = Tally()
    tables = {name: runner.kv_cache.group_tables(list(range(-(-ctx // runner.kv_cache.block_size))))
              for name, runner in runners.items()}
    for start in range(0, len(ids) - ctx + 1, ctx):
        window = [bos] + ids[start + 1:start + ctx]
        for first in range(0, ctx - 1, chunk):
            tokens = window[first:min(first + chunk, ctx - 1)]  # the last token has no target
            logits = {name: runner.run([ForwardChunk(tokens, first, tables[name], all_logits=True)])[0]
                      for name, runner in runners.items()}
            tally.add(logits, torch.tensor(window[first + 1:first + 1 + len(tokens)]))
        print(f"  ctx {ctx}: {tally.positions:,} positions, KLD so far {torch.cat(tally.kld).mean().item():.5f}",
              flush=True)
        if tally.positions >= max_positions:
            break
    return tally.summary()


def decode_speed(runners: dict[str, ModelRunner], ids: list[int], bos: int, ctx: int, chunk: int) -> dict:
    """Prefill ctx tokens into each cache, then alternate one-token steps: median tok/s per type."""
    times = {name: [] for name in runners}
    blocks = list(range(-(-(ctx + DECODE_STEPS + 2) // 16)))
    tables = {name: runner.kv_cache.group_tables(blocks) for name, runner in runners.items()}
    for name, runner in runners.items():
        for first in range(0, ctx, chunk):
            runner.run([ForwardChunk(([bos] + ids[1:ctx])[first:first + chunk], first, tables[name])])
    for step in range(DECODE_STEPS + 2):
        for name, runner in runners.items():
            began = time.perf_counter()
            runner.run([ForwardChunk([ids[ctx + step]], ctx + step, tables[name])])
            if step >= 2:  # the first steps warm allocator and caches
                times[name].append(time.perf_counter() - began)
    return {name: 1 / statistics.median(values) for name, values in times.items()}


def llamacpp_kld(threads: int, contexts: str, positions: int) -> dict:
    """llama.cpp's q8_0 KV against its f16 KV on the same model and windows (llamacpp_kv_kld.py in its venv)."""
    from llamacpp_env import llamacpp_python

    from ridgeline.model.checkpoint import resolve_model_path

    worker = Path(__file__).resolve().parent / "llamacpp_kv_kld.py"
    command = [str(llamacpp_python()), str(worker), "--model", str(resolve_model_path(None)), "--threads",
               str(threads), "--contexts", contexts, "--positions", str(positions)]
    return json.loads(subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--contexts", default="512,4096", help="window lengths compared")
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk: later chunks read the cache back")
    parser.add_argument("--positions", type=int, default=2048, help="at least this many positions per context")
    parser.add_argument("--llamacpp", action="store_true", help="also llama.cpp's q8_0 KV against its f16 KV")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--attention", choices=("torch", "compiled"), default="torch",
                        help="attention path of the accuracy runs (decode speed always runs each type's own path)")
    parser.add_argument("--decode-only", action="store_true", help="only capacity and decode speed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]

    began = time.perf_counter()
    longest = max(contexts) + DECODE_STEPS + 2
    caches = {name: KVCacheConfig(16, name, 0) for name in TYPES}
    assembled = assemble_model(None, cache=caches["bf16"], num_blocks=-(-longest // 16), tokenizer=True)
    model, config = assembled.runner.model, assembled.config
    runners = {name: ModelRunner(model, KVCache.for_blocks(config, cache, -(-longest // 16), torch.device("cpu")))
               for name, cache in caches.items()}
    ids = assembled.tokenizer.encode(TEXT.read_text(), add_bos=False)
    # llama-perplexity's window: BOS in the first slot (the default model's vocabulary adds one)
    bos = assembled.tokenizer.bos_id
    print(f"{assembled.name}: {len(ids):,} tokens of {TEXT.name}; threads {args.threads}", flush=True)

    results = {"model": assembled.name, "text": TEXT.name, "threads": args.threads, "chunk": args.chunk,
               "accuracy_attention": None if args.decode_only else args.attention}
    torch_attention_for_all(args.attention == "torch")
    for ctx in [] if args.decode_only else contexts:
        results[f"ctx_{ctx}"] = compare(runners, ids, bos, ctx, args.chunk, args.positions)
    torch_attention_for_all(False)  # decode speed on each type's own path: compiled where the kernels build
    budget = 2 << 30
    results["capacity_2GiB_4096_token_sequences"] = {
        name: pages_for_budget(config, KVCacheConfig(16, name, budget)) // pages_per_sequence(config, caches[name],
                                                                                              4096)
        for name in ("bf16", "q8_0")}
    fast = {name: runners[name] for name in ("bf16", "q8_0")}
    results[f"decode_tok_s_at_{max(contexts)}"] = decode_speed(fast, ids, bos, max(contexts), args.chunk)
    results["seconds"] = time.perf_counter() - began
    if args.llamacpp:
        print(json.dumps({"ridgeline": results}), flush=True)  # kept, whatever becomes of the llama.cpp run
        try:
            results["llamacpp"] = llamacpp_kld(args.threads, args.contexts, args.positions)
        except subprocess.CalledProcessError as error:
            results["llamacpp_error"] = str(error)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for ctx in [] if args.decode_only else contexts:
        r = results[f"ctx_{ctx}"]
        print(f"ctx {ctx:>5}: {r['positions']:,} positions | KLD q8_0 vs bf16 mean {r['kld_q8_vs_bf16_mean']:.5f} "
              f"(p99 {r['kld_q8_vs_bf16_p99']:.5f}, max {r['kld_q8_vs_bf16_max']:.4f}; bf16 vs fp32 "
              f"{r['kld_bf16_vs_fp32_mean']:.5f}) | top-1 agreement {r['top1_agreement']:.2%} | PPL bf16 "
              f"{r['ppl']['bf16']:.4f}, q8_0 {r['ppl']['q8_0']:.4f} ({r['ppl_change_q8_vs_bf16']:+.3%}), fp32 "
              f"{r['ppl']['fp32']:.4f}")
        print(f"           q8_0 vs fp16: KLD {r['kld_q8_vs_fp16_mean']:.5f} (p99 {r['kld_q8_vs_fp16_p99']:.5f})")
        if "llamacpp" in results:
            theirs = results["llamacpp"][f"ctx_{ctx}"]
            print(f"           llama.cpp q8_0 vs f16: KLD {theirs['kld_q8_vs_f16_mean']:.5f} (p99 {theirs['kld_q8_vs_f16_p99']:.5f}), "
                  f"top-1 {theirs['top1_agreement']:.2%}, PPL f16 {theirs['ppl']['f16']:.4f}, q8_0 "
                  f"{theirs['ppl']['q8_0']:.4f} ({theirs['ppl_change_q8_vs_f16']:+.3%}); {theirs['positions']:,} positions")
    capacity = results["capacity_2GiB_4096_token_sequences"]
    print(f"capacity (2 GiB, 4,096-token sequences): bf16 {capacity['bf16']:,}, q8_0 {capacity['q8_0']:,} "
          f"({capacity['q8_0'] / capacity['bf16']:.2f}x)")
    speed = results[f"decode_tok_s_at_{max(contexts)}"]
    print(f"decode at {max(contexts):,} context: bf16 {speed['bf16']:.1f} tok/s, q8_0 {speed['q8_0']:.1f} tok/s "
          f"({speed['q8_0'] / speed['bf16']:.2f}x); {results['seconds']:.0f} s in all")


if __name__ == "__main__":
    main()
