"""Speculative decoding (n-gram prompt lookup) against plain decoding, batch 1, greedy: decode tok/s per workload.

    .venv/bin/python benchmarks/speculative_decode.py [--threads 2] [--repetitions 3] [--k 3,5,8] [--json FILE]

Workloads (text prompts to the bundled default model, Gemma 3 270M Q4_K_M, a base model):
  copy-passage  a passage of the GPL (tests/data/reference/gpl-3.0.txt) "followed by an exact copy of it"
  copy-code     a Python function, then "the same code with `state` renamed to `entry`"
  open          the start of a story: nothing in the prompt to copy
Each runs with speculation off and with K = 3, 5, 8 guessed tokens, in one process under /tmp/ridgeline-cpu.lock,
the settings interleaved within each repetition (so drift on a shared machine touches all of them alike). Decode
tok/s = generated tokens after the first over the time from the first to the last (prefill excluded). Also the
acceptance rate (accepted / proposed guesses), mean tokens per decode step, and whether each run's greedy text
is identical to the run without speculation (it must be: the script fails otherwise).
"""

import argparse
import dataclasses
import datetime
import fcntl
import json
import platform
import statistics
import time
from pathlib import Path

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.engine.speculative import SpeculativeConfig

ROOT = Path(__file__).resolve().parent.parent
from llamacpp_env import CPU_LOCK  # noqa: E402 - the one lock every benchmark takes
PASSAGE = (ROOT / "tests/data/reference/gpl-3.0.txt").read_text().split("  When we speak of free software")[0]
PASSAGE = PASSAGE.split("Preamble")[1].strip()
CODE = '''def propose(self, seq, room):
    if room <= 0 or not self.eligible(seq):
        return []
    state = self._states.setdefault(seq.request_id, SequenceState(draft_len=self.config.num_tokens))
    state.steps += 1
    if state.steps < state.paused_until:
        return []
    tokens = seq.token_ids
    self._index(state, tokens)
    for n in range(min(self.config.ngram_max, len(tokens) - 1), self.config.ngram_min - 1, -1):
        end = state.last_end.get(tuple(tokens[-n:]))
        if end is not None:
            return list(tokens[end:end + min(room, state.draft_len)])
    return []
'''
# The bundled model is a base model (no instruction tuning): prompts are documents whose natural continuation copies
# (or not). Greedy decoding of a 270M model drifts into loops, which n-grams would predict too: the open prompt's
# length is cut where its text is still new.
WORKLOADS = {
    "copy-passage": ("Below is a passage, followed by an exact copy of it.\n\nPassage:\n" + PASSAGE + "\n\nCopy:\n", 160),
    "copy-code": ("Original:\n```python\n" + CODE + "```\n\nThe same code with `state` renamed to `entry`:\n```python\n",
                  160),
    "open": ("Once upon a time, in a small village by the sea, there lived", 56),
}


@dataclasses.dataclass
class Run:
    workload: str
    k: int
    tokens: list[int]
    text: str
    decode_tok_s: float
    decode_steps: int
    proposed: int
    accepted: int
    verifications: int


def engine(k: int, threads: int) -> LLMEngine:
    # Prefix caching off: every repetition prefills and decodes the same way (prefill is not timed anyway).
    return LLMEngine(EngineConfig(threads=threads, kv_cache=KVCacheConfig(memory_bytes=64 << 20),
                                  scheduler=SchedulerConfig(enable_prefix_caching=False),
                                  speculative=SpeculativeConfig(num_tokens=k)))


def run_one(llm: LLMEngine, workload: str, k: int, request_id: str) -> Run:
    message, max_tokens = WORKLOADS[workload]
    prompt = llm.tokenizer.encode(message)
    before = llm.stats()
    llm.add_request(request_id, prompt, SamplingParams(temperature=0, max_tokens=max_tokens))
    first = last = None
    steps = 0
    output = None
    while llm.has_unfinished():
        outputs = llm.step()
        now = time.perf_counter()
        if first is not None:
            steps += 1
        for output in outputs:
            if first is None and output.output_token_ids:
                first = now
            last = now
    after = llm.stats()
    generated = len(output.output_token_ids)
    return Run(workload, k, list(output.output_token_ids), output.text,
               (generated - 1) / (last - first) if last > first else 0.0, steps,
               after.num_draft_tokens - before.num_draft_tokens,
               after.num_accepted_tokens - before.num_accepted_tokens,
               after.num_verifications - before.num_verifications)


def summarise(runs: list[Run], workloads: list[str], ks: list[int]) -> list[dict]:
    rows = []
    for workload in workloads:
        base = [r for r in runs if r.workload == workload and r.k == 0]
        base_tok_s = statistics.mean(r.decode_tok_s for r in base)
        for k in ks:
            mine = [r for r in runs if r.workload == workload and r.k == k]
            tok_s = [r.decode_tok_s for r in mine]
            proposed, accepted = sum(r.proposed for r in mine), sum(r.accepted for r in mine)
            rows.append({
                "workload": workload, "k": k, "generated_tokens": len(mine[0].tokens),
                "decode_tok_s": statistics.mean(tok_s), "decode_tok_s_sd": statistics.stdev(tok_s) if len(tok_s) > 1 else 0.0,
                "runs_tok_s": tok_s, "speedup": statistics.mean(tok_s) / base_tok_s,
                "median_speedup": statistics.median(tok_s) / statistics.median(r.decode_tok_s for r in base),
                "acceptance_rate": accepted / proposed if proposed else 0.0,
                "tokens_per_step": statistics.mean((len(r.tokens) - 1) / max(r.decode_steps, 1) for r in mine),
                "verifying_steps": statistics.mean(r.verifications / max(r.decode_steps, 1) for r in mine),
                "identical_to_off": all(r.tokens == base[0].tokens for r in mine),
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--k", default="3,5,8", help="guessed tokens per step to try (0 = off is always run)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--show-text", action="store_true", help="print each workload's greedy text")
    args = parser.parse_args()
    ks = [0] + [int(k) for k in args.k.split(",") if int(k)]
    workloads = args.workloads.split(",")

    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = datetime.datetime.now().astimezone()
        engines = {k: engine(k, args.threads) for k in ks}
        for k, llm in engines.items():  # warm-up: first calls allocate and touch every buffer
            run_one(llm, "open", k, f"warm-{k}")
        runs = []
        for repetition in range(args.repetitions):
            for workload in workloads:
                for k, llm in engines.items():
                    runs.append(run_one(llm, workload, k, f"{workload}-{k}-{repetition}"))
        finished = datetime.datetime.now().astimezone()

    rows = summarise(runs, workloads, ks)
    print(f"speculative decoding, batch 1, greedy, {args.threads} threads, {args.repetitions} runs each, "
          f"{started:%Y-%m-%d %H:%M %Z}")
    print(f"{'workload':13} {'K':>2} {'tokens':>6} {'decode tok/s':>15} {'speedup':>7} {'accepted':>8} "
          f"{'tok/step':>8} {'identical':>9}")
    for row in rows:
        print(f"{row['workload']:13} {row['k'] or 'off':>2} {row['generated_tokens']:6} "
              f"{row['decode_tok_s']:8.1f} ± {row['decode_tok_s_sd']:4.1f} {row['speedup']:6.2f}x "
              f"{row['acceptance_rate']:8.0%} {row['tokens_per_step']:8.2f} {'yes' if row['identical_to_off'] else 'NO':>9}")
    if args.show_text:
        for workload in workloads:
            text = next(r.text for r in runs if r.workload == workload and r.k == 0)
            print(f"--- {workload} ---\n{text}\n")
    if args.json:
        args.json.write_text(json.dumps({
            "started": started.isoformat(timespec="seconds"), "finished": finished.isoformat(timespec="seconds"),
            "machine": platform.node(), "threads": args.threads, "repetitions": args.repetitions,
            "model": "bundled default (Gemma 3 270M Q4_K_M)", "rows": rows,
            "texts": {w: next(r.text for r in runs if r.workload == w and r.k == 0) for w in workloads},
        }, indent=2) + "\n")
    if not all(row["identical_to_off"] for row in rows):
        raise SystemExit("greedy text differs with speculation on")


if __name__ == "__main__":
    main()
