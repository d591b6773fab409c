"""Where the time of a batch-1 decode step goes: kernel time per part against the bandwidth each matmul reached.

    .venv/bin/python benchmarks/decode_step_profile.py [--threads 2] [--steps 64] [--rows 1,4,9] [--json FILE] [--modules]

One greedy request on the engine (the bundled default model unless --model), `--steps` decode steps timed by part
(src/ridgeline/bench/step_profile.py: each module's forward wrapped, exclusive times): every matmul by role and
storage format with the weight bytes a call streams and the GB/s that makes, attention, norms, the rest of the
model, and everything outside it. Beside it the read bandwidth measured in the same run (a STREAM-like sum,
machine/measure.py). `--rows`: also bare forward passes of that many generated-token rows with logits for each,
the shape of a speculative verification step (1 + K rows), to see what the extra rows cost and where.
A layer that runs as one compiled call (model/layers/decode_layer.py) is one part; `--modules` runs every layer
module by module instead (the same bits, slower), so that each op is timed on its own.
Runs under /tmp/ridgeline-cpu.lock.
"""

import argparse
import datetime
import fcntl
import json
from dataclasses import asdict

import torch

from ridgeline.machine.measure import measure_read_bandwidth
from ridgeline.bench.step_profile import OUTSIDE, StepProfiler, format_profile
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.model.attention_batch import ForwardChunk
from ridgeline.model.layers import decode_layer

from llamacpp_env import CPU_LOCK  # noqa: E402 - the one lock every benchmark takes
PROMPT = "Once upon a time, in a small village by the sea, there lived"


def profile_engine_steps(llm: LLMEngine, steps: int):
    """Decode steps of one greedy request at batch 1 (the first step, its prefill, is not counted)."""
    llm.add_request("warm", PROMPT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    while llm.has_unfinished():
        llm.step()
    llm.add_request("profiled", PROMPT, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    llm.step()  # prefill
    with StepProfiler(llm.runner.model) as profiler:
        while llm.has_unfinished():
            with profiler.step():
                llm.step()
    return profiler.profile


def profile_rows(llm: LLMEngine, rows: int, steps: int):
    """Bare forward passes of `rows` generated-token rows, each with its logits (a verification step's shape)."""
    runner, block = llm.runner, llm.runner.kv_cache.block_size
    context = 64
    tables = runner.kv_cache.group_tables(list(range(-(-(context + rows) // block))))
    ids = (llm.tokenizer.encode(PROMPT) * rows)[:rows]

    def forward() -> None:
        runner.forward([ForwardChunk(ids, context, tables, all_logits=True, num_prompt_tokens=0)])

    forward()
    with StepProfiler(runner.model) as profiler:
        for _ in range(steps):
            with profiler.step():
                forward()
    profile = profiler.profile
    profile.parts["outside the model (runner: the batch's metadata)"] = profile.parts.pop(OUTSIDE)
    return profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rows", default="", help="also profile bare forward passes of these row counts, e.g. 1,4,9")
    parser.add_argument("--json", default=None, help="write the per-step parts here")
    parser.add_argument("--modules", action="store_true",
                        help="run each layer module by module (no compiled layer calls): time every op on its own")
    args = parser.parse_args()
    decode_layer.enabled = not args.modules

    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = datetime.datetime.now().astimezone()
        llm = LLMEngine(EngineConfig(model=args.model, threads=args.threads,
                                     kv_cache=KVCacheConfig(memory_bytes=64 << 20)))
        bandwidth = measure_read_bandwidth(args.threads)
        profiles = {"engine step, batch 1": profile_engine_steps(llm, args.steps)}
        for rows in [int(r) for r in args.rows.split(",") if r]:
            profiles[f"forward pass, {rows} generated rows with logits"] = profile_rows(llm, rows, args.steps)

    path = "module by module" if args.modules else "compiled layer calls where they fit"
    print(f"{llm.model_name}, {torch.get_num_threads()} threads, {args.steps} steps each, {path}, "
          f"{started:%Y-%m-%d %H:%M %Z}; ms are means per step")
    for title, profile in profiles.items():
        print()
        print(format_profile(profile, bandwidth, title))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"started": started.isoformat(timespec="seconds"), "threads": args.threads,
                       "read_bandwidth": bandwidth, "steps": args.steps,
                       "profiles": {title: {name: asdict(part) for name, part in profile.per_step().items()}
                                    for title, profile in profiles.items()}}, out, indent=2)


if __name__ == "__main__":
    main()
