"""Chunked prefill: 8 streams decoding when a 2,000-token prompt arrives; their inter-token latency with and without.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/chunked_prefill_itl.py [--threads 2] [--budgets 64,256] [--json]

For each scheduler setting (chunked at each --budgets token budget, then unchunked: the whole prompt in one step
beside the decodes), a fresh engine runs --streams requests of --stream-prompt random ids generating
--stream-tokens each; once every stream has --arrive-after tokens, the long prompt arrives. The streams' ITLs
(gaps between consecutive tokens, RequestOutput.timings.itls) over their whole generation give p50, p99 and max.
Target with chunking: p99 <= 3x p50. Without chunking the long prompt's prefill is one step every stream waits
through: the stall.
"""

import argparse
import json
import random

import numpy as np

from ridgeline.engine.options import engine_config
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.engine.sampling_params import SamplingParams

TARGET_P99_OVER_P50 = 3.0
UNCHUNKED_BUDGET = 2048  # holds the long prompt and the decodes in one step


def run_scenario(engine: LLMEngine, args: argparse.Namespace) -> dict:
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    stream_params = SamplingParams(max_tokens=args.stream_tokens, temperature=0.0, ignore_eos=True)
    streams = [f"stream-{i}" for i in range(args.streams)]
    for request_id in streams:
        engine.add_request(request_id, [rng.randrange(vocab) for _ in range(args.stream_prompt)], stream_params)
    long_prompt = [rng.randrange(vocab) for _ in range(args.long_prompt)]
    produced = dict.fromkeys(streams, 0)
    finished: dict[str, RequestOutput] = {}
    arrived = False
    while engine.has_unfinished():
        for output in engine.step():
            produced[output.request_id] = len(output.output_token_ids)
            if output.finished:
                finished[output.request_id] = output
        if not arrived and min(produced[s] for s in streams) >= args.arrive_after:
            engine.add_request("long", long_prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            arrived = True
    itls = np.array([gap for s in streams for gap in finished[s].timings.itls])
    p50, p99 = np.percentile(itls, 50), np.percentile(itls, 99)
    return {"p50_itl_s": p50, "p99_itl_s": p99, "max_itl_s": itls.max(), "p99_over_p50": p99 / p50,
            "num_itls": len(itls), "long_prompt_ttft_s": finished["long"].timings.ttft}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--budgets", default="64,256", help="comma-separated max_num_batched_tokens for the chunked runs")
    parser.add_argument("--streams", type=int, default=8, help="sequences decoding when the long prompt arrives")
    parser.add_argument("--stream-prompt", type=int, default=64, help="prompt tokens of each stream")
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens each stream generates")
    parser.add_argument("--arrive-after", type=int, default=16, help="stream tokens before the long prompt arrives")
    parser.add_argument("--long-prompt", type=int, default=2000, help="tokens of the prompt that arrives")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    settings = [(f"chunked, budget {b}", int(b), True) for b in args.budgets.split(",")]
    settings.append((f"unchunked, budget {UNCHUNKED_BUDGET}", UNCHUNKED_BUDGET, False))
    results = {}
    for name, budget, chunked in settings:
        config = engine_config(args.model, threads=args.threads, max_num_batched_tokens=budget, chunked_prefill=chunked)
        results[name] = run_scenario(LLMEngine(config), args) | {"budget": budget, "chunked": chunked}
    for result in results.values():
        result["target_met"] = bool(result["p99_over_p50"] <= TARGET_P99_OVER_P50) if result["chunked"] else None
    if args.json:
        print(json.dumps(results, indent=2, default=float))
        return
    print(f"{args.streams} streams decoding, a {args.long_prompt}-token prompt arrives after {args.arrive_after} of their "
          f"{args.stream_tokens} tokens; {args.threads} threads; ITL over all streams' tokens")
    print(f"{'scheduler':26} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99/p50':>8} {'long TTFT s':>12}")
    for name, r in results.items():
        verdict = "" if r["target_met"] is None else f"  target <= {TARGET_P99_OVER_P50:.0f}x {'met' if r['target_met'] else 'missed'}"
        print(f"{name:26} {r['p50_itl_s'] * 1e3:8.1f} {r['p99_itl_s'] * 1e3:8.1f} {r['max_itl_s'] * 1e3:8.1f} "
              f"{r['p99_over_p50']:7.2f}x {r['long_prompt_ttft_s']:12.2f}{verdict}")


if __name__ == "__main__":
    main()
