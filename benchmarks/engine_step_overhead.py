"""Where an engine decode step spends its time outside the model, at batch 1 and batch 8, and the decode tok/s.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/engine_step_overhead.py [--batches 1,8] [--steps 64]

B greedy requests of --input-len random prompt ids (no prefix hits between them) enter the engine together; after
their prefill, --steps pure decode steps are timed, twice: once bare, for the step time and tok/s (B tokens a step;
the median and the best of --repeats runs: on a shared machine other processes only ever slow a run), and once with every part of the step wrapped in a perf_counter_ns timer (schedule,
forward chunks, batch metadata, the model, step record, sampling, detokenise, update, outputs), for the breakdown,
and also as two spans: from the step's start to the model's, and from the model's end to the step's.
"outside the model" is the instrumented step minus the model's forward, as in decode_step_profile.py (which also
counts the batch metadata outside). The wrappers cost about a microsecond each, a dozen a step.

Does not take the CPU lock itself: run it under `flock /tmp/ridgeline-cpu.lock`.
"""

import argparse
import json
import random
import statistics
import time
from collections import defaultdict

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams

MODEL = "model forward"
BEFORE, AFTER = "(all before the model)", "(all after the model)"


class PhaseTimer:
    """Nanoseconds spent in each wrapped callable while enabled."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.enabled = False

    def wrap(self, name: str, call):
        ns, clock = self.ns, time.perf_counter_ns

        def timed(*args, **kwargs):
            if not self.enabled:
                return call(*args, **kwargs)
            start = clock()
            try:
                return call(*args, **kwargs)
            finally:
                ns[name] += clock() - start

        return timed

    def instrument(self, llm: LLMEngine) -> None:
        llm.scheduler.schedule = self.wrap("schedule", llm.scheduler.schedule)
        llm.scheduler.update = self.wrap("scheduler update", llm.scheduler.update)
        llm._forward_chunk = self.wrap("forward chunks (engine -> model)", llm._forward_chunk)
        llm.steps.record = self.wrap("step record", llm.steps.record)
        llm._sample = self.wrap("sample", llm._sample)
        processor = llm.output_processor
        processor.collect_prompt_logprobs = self.wrap("prompt logprobs", processor.collect_prompt_logprobs)
        processor.detokenize = self.wrap("detokenise + stop strings", processor.detokenize)
        processor.outputs = self.wrap("request outputs", processor.outputs)
        if hasattr(llm.runner, "batches"):  # engine/step_batch.py
            llm.runner.batches.build = self.wrap("batch metadata (AttentionBatch)", llm.runner.batches.build)
        else:  # before it (to measure an older checkout with this script)
            from ridgeline.engine import model_runner
            build = self.wrap("batch metadata (AttentionBatch)", model_runner.AttentionBatch.build)
            model_runner.AttentionBatch.build = staticmethod(build)
        # The step's boundaries: from its start to the model's, and from the model's end to the step's.
        marks = {}
        step = llm.step

        def timed_step():
            marks["step"] = time.perf_counter_ns()
            outputs = step()
            if self.enabled and "model end" in marks:
                self.ns[AFTER] += time.perf_counter_ns() - marks.pop("model end")
            return outputs

        llm.step = timed_step

        def before_model(*_):
            marks["model"] = time.perf_counter_ns()
            if self.enabled:
                self.ns[BEFORE] += marks["model"] - marks["step"]

        def after_model(*_):
            marks["model end"] = time.perf_counter_ns()
            if self.enabled:
                self.ns[MODEL] += marks["model end"] - marks["model"]

        llm.runner.model.register_forward_pre_hook(before_model)
        llm.runner.model.register_forward_hook(after_model)


def add_batch(llm: LLMEngine, batch: int, input_len: int, max_tokens: int, rng: random.Random, tag: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    vocab = llm.model_config.vocab_size
    for i in range(batch):
        llm.add_request(f"{tag}-{i}", [rng.randrange(vocab) for _ in range(input_len)], params)


def decode_steps(llm: LLMEngine, batch: int, input_len: int, steps: int, rng: random.Random, tag: str,
                 timer: PhaseTimer | None = None) -> float:
    """Seconds per decode step of `batch` sequences (prefill not timed)."""
    add_batch(llm, batch, input_len, steps + 1, rng, tag)
    while llm.scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in llm.scheduler.running):
        llm.step()  # prefill (and the first token)
    if timer:
        timer.enabled = True
    start = time.perf_counter_ns()
    done = 0
    while llm.has_unfinished():
        llm.step()
        done += 1
    elapsed = time.perf_counter_ns() - start
    if timer:
        timer.enabled = False
    return elapsed / 1e9 / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    llm = LLMEngine(EngineConfig(model=args.model, threads=args.threads,
                                 kv_cache=KVCacheConfig(memory_bytes=256 << 20)))
    rng = random.Random(0)
    decode_steps(llm, 1, 16, 8, rng, "warm")
    timer = PhaseTimer()
    timer.instrument(llm)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{llm.model_name}, {args.threads} threads, {args.input_len} prompt tokens, {args.steps} decode steps, "
          f"{started}; ms are means per decode step")
    figures = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        bare = [decode_steps(llm, batch, args.input_len, args.steps, rng, f"b{batch}-{r}") for r in range(args.repeats)]
        step_s = statistics.median(bare)
        timer.ns.clear()
        instrumented_s = decode_steps(llm, batch, args.input_len, args.steps, rng, f"b{batch}-timed", timer)
        parts = {name: ns / 1e6 / args.steps for name, ns in timer.ns.items()}
        boundaries = {name: parts.pop(name) for name in (BEFORE, AFTER)}
        # No timed part contains another; the rest of step() is what no wrapper covers.
        parts["rest of step() (untimed glue)"] = instrumented_s * 1e3 - sum(parts.values())
        parts |= boundaries
        outside = instrumented_s * 1e3 - parts[MODEL]
        best_s = min(bare)  # other processes only ever slow a run down
        figures[batch] = {"step_ms": step_s * 1e3, "tok_s": batch / step_s, "best_step_ms": best_s * 1e3,
                          "best_tok_s": batch / best_s, "outside_model_ms": outside,
                          "instrumented_step_ms": instrumented_s * 1e3, "parts_ms": parts}
        print(f"\nbatch {batch}: step {step_s * 1e3:.3f} ms (median of {args.repeats}), {batch / step_s:.1f} tok/s "
              f"(best {best_s * 1e3:.3f} ms, {batch / best_s:.1f} tok/s); "
              f"outside the model {outside:.3f} ms of an instrumented {instrumented_s * 1e3:.3f} ms step")
        for name, ms in sorted(parts.items(), key=lambda item: (item[0] in boundaries, -item[1])):
            print(f"  {name:40} {ms:8.3f} ms")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"started": started, "threads": args.threads, "input_len": args.input_len,
                       "steps": args.steps, "batches": figures}, out, indent=2)


if __name__ == "__main__":
    main()
