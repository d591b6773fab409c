"""Prefix caching: TTFT of a 1,500-token prompt whose first 1,400 tokens are cached, against the same prompt cold.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/prefix_cache_ttft.py [--threads 2] [--json]

Each repetition, through the engine's public step function, one request at a time:
  cold:  a fresh prompt of --prompt-len random ids (nothing of it cached);
  prime: a different request of just the --prefix-len shared prefix (untimed), which leaves its full blocks cached;
  warm:  that prefix + --prompt-len minus --prefix-len new ids.
TTFT = arrival to first token (RequestOutput.timings.ttft). Only full blocks are cached, so the warm request hits
the prefix rounded down to the block size. Target: median cold TTFT >= 10x median warm TTFT.
"""

import argparse
import json
import random
import statistics

from ridgeline.engine.options import engine_config
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.engine.sampling_params import SamplingParams

TARGET_RATIO = 10.0


def first_token(engine: LLMEngine, request_id: str, prompt: list[int]) -> RequestOutput:
    """Run one request to its first (and only) token; the engine holds nothing else."""
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while True:
        for output in engine.step():
            if output.finished:
                return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--prompt-len", type=int, default=1500, help="tokens in the timed prompts")
    parser.add_argument("--prefix-len", type=int, default=1400, help="leading tokens shared with the primed request")
    parser.add_argument("--repetitions", type=int, default=3, help="cold/warm pairs (medians reported)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    engine = LLMEngine(engine_config(args.model, threads=args.threads))  # prefix caching is on by default
    rng = random.Random(0)

    def random_ids(length: int) -> list[int]:
        return [rng.randrange(engine.model_config.vocab_size) for _ in range(length)]

    first_token(engine, "warmup", random_ids(64))
    cold, warm = [], []
    for rep in range(args.repetitions):
        cold.append(first_token(engine, f"cold-{rep}", random_ids(args.prompt_len)))
        prefix = random_ids(args.prefix_len)
        first_token(engine, f"prime-{rep}", prefix)
        warm.append(first_token(engine, f"warm-{rep}", prefix + random_ids(args.prompt_len - args.prefix_len)))
    cold_ttft = statistics.median(o.timings.ttft for o in cold)
    warm_ttft = statistics.median(o.timings.ttft for o in warm)
    cached = sorted({o.num_cached_tokens for o in warm})
    result = {
        "prompt_tokens": args.prompt_len, "prefix_tokens": args.prefix_len, "threads": args.threads,
        "cold_ttft_s": [o.timings.ttft for o in cold], "warm_ttft_s": [o.timings.ttft for o in warm],
        "cold_cached_tokens": sorted({o.num_cached_tokens for o in cold}), "warm_cached_tokens": cached,
        "median_cold_ttft_s": cold_ttft, "median_warm_ttft_s": warm_ttft, "ratio": cold_ttft / warm_ttft,
        "target_met": cold_ttft / warm_ttft >= TARGET_RATIO, "prefix_cache_hit_rate": engine.stats().prefix_cache_hit_rate,
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.prompt_len}-token prompt, {args.threads} threads, {args.repetitions} repetitions (medians)")
    print(f"  cold TTFT  {cold_ttft * 1e3:9.1f} ms   (cached tokens: {result['cold_cached_tokens']})")
    print(f"  warm TTFT  {warm_ttft * 1e3:9.1f} ms   (first {args.prefix_len} shared; cached tokens: {cached})")
    print(f"  cold / warm = {result['ratio']:.1f}x   target >= {TARGET_RATIO:.0f}x "
          f"{'met' if result['target_met'] else 'missed'}")


if __name__ == "__main__":
    main()
