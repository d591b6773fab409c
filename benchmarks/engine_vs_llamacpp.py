"""ridgeline's engine vs llama.cpp, side by side in one run: aggregate decode tok/s at 1..64 concurrent sequences.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/engine_vs_llamacpp.py [--threads 2] [--json]

ridgeline: `bench throughput` (B requests of --input-len random ids, --output-len tokens each, through the
engine's step function). llama.cpp: what `llama-batched-bench` does (B sequences, each its own prompt, prefilled
together in batches of n_batch, then one-token decode steps for all B at once, no sampling), driven through
llama-cpp-python's low-level batch API with one sequence id per sequence, in its own environment
(benchmarks/.venv-llamacpp, shared with bench_vs_llamacpp.py; built once on first use). Both count the
B x (output_len - 1) tokens of the decode steps over their time; prefill is reported apart.
Target: ridgeline >= 1.5x llama.cpp at 16 and 32 sequences. Then, at those batch sizes, where ridgeline's decode
step spends its time (wall time of each part of the step, measured by wrapping the engine's parts).

This file is also the llama.cpp worker (`--llamacpp-worker`, run by the llama.cpp environment's Python), so its
top level imports only the standard library. Run it under the CPU lock; it does not take the lock itself.
"""

import argparse
import json
import random
import subprocess
import time
from collections import defaultdict
from pathlib import Path

TARGET_BATCHES, TARGET_RATIO = (16, 32), 1.5
PROFILE_STEPS = 12
LLAMA_N_BATCH, LLAMA_N_UBATCH = 2048, 512  # llama-batched-bench's defaults


# ---- llama.cpp side (runs in benchmarks/.venv-llamacpp) ----------------------------------------------------------
def llamacpp_batched(model: str, threads: int, batch_sizes: list[int], input_len: int, output_len: int) -> list[dict]:
    import llama_cpp as lc

    lc.llama_backend_init()
    llama_model = lc.llama_model_load_from_file(model.encode(), lc.llama_model_default_params())
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(llama_model))
    params = lc.llama_context_default_params()
    params.n_seq_max = max(batch_sizes)
    params.n_ctx = params.n_seq_max * (input_len + output_len)  # each sequence gets its own n_ctx / n_seq_max cells
    params.n_batch, params.n_ubatch = LLAMA_N_BATCH, LLAMA_N_UBATCH
    params.n_threads = params.n_threads_batch = threads
    params.swa_full = False  # as llama-batched-bench: sliding-window layers keep only their window
    ctx = lc.llama_init_from_model(llama_model, params)
    batch = lc.llama_batch_init(LLAMA_N_BATCH, 0, 1)
    rng = random.Random(0)

    def decode(entries: list[tuple[int, int, int, bool]]) -> None:
        """(token, position, sequence id, wants logits) rows, submitted n_batch at a time."""
        for first in range(0, len(entries), LLAMA_N_BATCH):
            part = entries[first : first + LLAMA_N_BATCH]
            for i, (token, position, seq, logits) in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, position, 1, logits
                batch.seq_id[i][0] = seq
            batch.n_tokens = len(part)
            if lc.llama_decode(ctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed on {len(part)} tokens")
        lc.llama_synchronize(ctx)

    def run(sequences: int, prompt_len: int, decode_steps: int) -> dict:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        prompt = [(rng.randrange(n_vocab), p, s, p == prompt_len - 1) for s in range(sequences) for p in range(prompt_len)]
        steps = [[(rng.randrange(n_vocab), prompt_len + t, s, True) for s in range(sequences)] for t in range(decode_steps)]
        start = time.perf_counter()
        decode(prompt)
        prefilled = time.perf_counter()
        for step in steps:
            decode(step)
        end = time.perf_counter()
        return {"batch": sequences, "prefill_s": prefilled - start, "decode_s": end - prefilled,
                "decode_tokens": sequences * decode_steps, "decode_tok_s": sequences * decode_steps / (end - prefilled),
                "prefill_tok_s": sequences * prompt_len / (prefilled - start)}

    run(1, 16, 2)  # warm-up
    results = [run(b, input_len, output_len - 1) for b in batch_sizes]
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(llama_model)
    return results


# ---- ridgeline side -------------------------------------------------------------------------------------------
class StepProfile:
    """Wall time of each part of an engine step, by wrapping the engine's parts (instrumentation only)."""

    def __init__(self, engine) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.enabled = False
        scheduler, runner = engine.scheduler, engine.runner
        scheduler.schedule = self._timed("scheduler.schedule", scheduler.schedule)
        scheduler.update = self._timed("scheduler.update", scheduler.update)
        runner.forward = self._timed("runner.run", runner.forward)
        engine.sampler = self._timed("sampling", engine.sampler)
        model = runner.model
        self._hook(model, "model forward")
        self._hook(model.embedding, "embedding")
        self._hook(model.lm_head, "lm head")
        self._hook(model.norm, "norms")
        for layer in model.layers:
            self._hook(layer.attention, "attention (all)")
            for projection in (layer.attention.qkv, layer.attention.o):
                self._hook(projection, "attention q/k/v/o projections")
            self._hook(layer.mlp, "mlp (gate/up/down + activation)")
            for norm in (layer.attn_norm, layer.post_attn_norm, layer.ffn_norm, layer.post_ffn_norm):
                if norm is not None:
                    self._hook(norm, "norms")

    def _timed(self, name, call):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                if self.enabled:
                    self.seconds[name] += time.perf_counter() - start

        return timed

    def _hook(self, module, name) -> None:
        starts = []
        module.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))

        def after(*_):
            elapsed = time.perf_counter() - starts.pop()
            if self.enabled:
                self.seconds[name] += elapsed

        module.register_forward_hook(after)

    def breakdown(self, step_seconds: float, steps: int) -> dict[str, float]:
        """Milliseconds per step of disjoint parts that add up to the whole step."""
        s = self.seconds
        layers = s["attention (all)"] + s["mlp (gate/up/down + activation)"] + s["norms"]
        parts = {
            "embedding": s["embedding"],
            "attention q/k/v/o projections": s["attention q/k/v/o projections"],
            "attention core (qk-norm, rope, KV write, paged attention)": s["attention (all)"] - s["attention q/k/v/o projections"],
            "mlp (gate/up/down + activation)": s["mlp (gate/up/down + activation)"],
            "norms": s["norms"],
            "lm head": s["lm head"],
            "rest of forward (rope tables, residual adds, row select)": s["model forward"] - layers - s["embedding"] - s["lm head"],
            "attention metadata build + logits split": s["runner.run"] - s["model forward"],
            "sampling": s["sampling"],
            "scheduler (schedule + update)": s["scheduler.schedule"] + s["scheduler.update"],
            "engine Python (detokenise, stop checks, outputs)": step_seconds - s["runner.run"] - s["sampling"]
                                                                - s["scheduler.schedule"] - s["scheduler.update"],
        }  # fmt: skip
        return {name: 1e3 * value / steps for name, value in parts.items()} | {"step total": 1e3 * step_seconds / steps}


def profile_decode(engine, profile: StepProfile, batch: int, input_len: int, vocab_size: int) -> dict[str, float]:
    """Time PROFILE_STEPS pure decode steps of `batch` sequences at a context of about `input_len`."""
    from ridgeline.engine.sampling_params import SamplingParams

    rng = random.Random(batch)
    params = SamplingParams(max_tokens=PROFILE_STEPS + 8, temperature=0.0, ignore_eos=True)
    ids = [f"profile-{batch}-{i}" for i in range(batch)]
    for request_id in ids:
        engine.add_request(request_id, [rng.randrange(vocab_size) for _ in range(input_len)], params)
    started: set[str] = set()
    while len(started) < batch:  # prefill, not profiled
        started.update(o.request_id for o in engine.step())
    profile.seconds.clear()
    profile.enabled = True
    start = time.perf_counter()
    for _ in range(PROFILE_STEPS):
        engine.step()
    step_seconds = time.perf_counter() - start
    profile.enabled = False
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    return profile.breakdown(step_seconds, PROFILE_STEPS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled Gemma 3 270M Q4_K_M)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both engines")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64", help="comma-separated concurrent sequences")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens per sequence")
    parser.add_argument("--output-len", type=int, default=128, help="tokens per sequence (the first from prefill)")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-part profile of ridgeline's decode step")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--llamacpp-worker", help=argparse.SUPPRESS)  # JSON arguments: run llamacpp_batched, print JSON
    args = parser.parse_args()
    if args.llamacpp_worker:
        print(json.dumps(llamacpp_batched(**json.loads(args.llamacpp_worker))))
        return

    from llamacpp_env import llamacpp_python

    from ridgeline.bench.bench_throughput import ThroughputConfig, run_throughput
    from ridgeline.engine.options import engine_config
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.model.checkpoint import resolve_model_path

    model = resolve_model_path(args.model)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    python = llamacpp_python()  # builds the shared environment first if it is missing

    config = ThroughputConfig(engine_config(model, threads=args.threads), tuple(sizes), args.input_len, args.output_len)
    engine = LLMEngine(config.engine)
    ours = run_throughput(config, engine=engine)
    worker_args = {"model": str(model), "threads": args.threads, "batch_sizes": sizes,
                   "input_len": args.input_len, "output_len": args.output_len}
    done = subprocess.run([str(python), __file__, "--llamacpp-worker", json.dumps(worker_args)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the llama.cpp worker failed:\n{done.stderr}")
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    profiles = {}
    if not args.no_profile:
        profile = StepProfile(engine)
        for batch in TARGET_BATCHES:
            profiles[batch] = profile_decode(engine, profile, batch, args.input_len, engine.model_config.vocab_size)

    rows = [(r, t, r.decode_tok_s / t["decode_tok_s"]) for r, t in zip(ours.results, theirs)]
    verdicts = {r.batch: ratio >= TARGET_RATIO for r, _, ratio in rows if r.batch in TARGET_BATCHES}
    if args.json:
        print(json.dumps({"ridgeline": ours.summary(), "llama_cpp": theirs,
                          "ratio": {r.batch: ratio for r, _, ratio in rows}, "target_met": verdicts,
                          "decode_step_profile_ms": profiles}, indent=2))
        return
    print(f"{model.name}, {ours.threads} threads, {args.input_len} prompt + {args.output_len} generated tokens per sequence")
    print("aggregate decode tok/s (tokens of the decode steps / their time); prefill tok/s of the prefill phase")
    print(f"{'batch':>5} {'ridgeline':>10} {'llama.cpp':>10} {'ratio':>7} {'roofline':>9} {'% roof':>7}"
          f" {'prefill ours':>13} {'prefill llama':>14}")
    for r, t, ratio in rows:
        mark = f"  target {TARGET_RATIO}x {'met' if verdicts[r.batch] else 'missed'}" if r.batch in verdicts else ""
        print(f"{r.batch:5} {r.decode_tok_s:10.1f} {t['decode_tok_s']:10.1f} {ratio:6.2f}x {r.roofline_tok_s:9.0f} "
              f"{r.fraction_of_roofline:7.1%} {r.prefill_tok_s:13.1f} {t['prefill_tok_s']:14.1f}{mark}")
    for batch, parts in profiles.items():
        total = parts["step total"]
        print(f"\nridgeline decode step at batch {batch}: {total:.1f} ms ({batch / total * 1e3:.1f} tok/s over "
              f"{PROFILE_STEPS} steps, context ~{args.input_len})")
        for name, ms in parts.items():
            if name != "step total":
                print(f"  {name:58} {ms:8.2f} ms {ms / total:6.1%}")


if __name__ == "__main__":
    main()
