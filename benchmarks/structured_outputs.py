"""Structured outputs on the default model (Gemma 3 270M, 262,144-token vocabulary): what a constraint costs, and how
many constrained answers are valid and finished.

    .venv/bin/python benchmarks/structured_outputs.py [--repetitions 5] [--max-tokens 128] [--validity 96,192]
                                                      [--skip-validity] [--temperatures 0,1]
                                                      [--only decode,...] [--json FILE]

In one process under /tmp/ridgeline-cpu.lock:
  vocabulary    building llguidance's view of the vocabulary (once per engine)
  compile       a 50-property schema and corpus schemas, cold and cached (median)
  mask          per row: llguidance's packed mask (all the worker does); a greedy row's argmax where allowed (a bit
                read) and where forbidden (a random row: bits unpacked); 16 sampled rows masked in one op
  decode        constrained vs unconstrained decode tok/s at batch 1 and 16, greedy and at temperature 1 (seeded):
                a JSON schema whose answer is one long
                string (it runs to max_tokens, as the unconstrained run with ignore_eos does), the two interleaved
                within each repetition, medians; decode tok/s = tokens after the first over first-to-last token time
  profile       where a decode step's time goes at batch 16, temperature 1, constrained against unconstrained (the
                two interleaved): per step, the forward pass, the sampler, the grammars taking their tokens, the wait
                for the masks, the rest; the mask worker's time; how many constrained draws the grammar refused
                (drawn again from the masked row, engine/sampler.py)
  ttft          wall time of a 1-token request: unconstrained, a cold grammar (a schema never seen), a cached one
  validity      the whole corpus (tests/structured_schemas.py), greedy and sampled at temperature 1, with and without
                the default bounds (json_schemas/bounds.py) and the closing near max_tokens (matcher.py):
                finished answers, and how many of those validate (jsonschema, formats checked)
(xgrammar against llguidance: benchmarks/grammar_engines.py, in a private environment.)
"""

import argparse
import datetime
import fcntl
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from llamacpp_env import CPU_LOCK  # noqa: E402 - the one lock every benchmark takes
from structured_schemas import SCHEMAS, run_corpus  # noqa: E402

from ridgeline.engine.llm import LLM  # noqa: E402
from ridgeline.engine.sampling_params import SamplingParams  # noqa: E402
from ridgeline.engine.structured import StructuredOutputsParams as Structured  # noqa: E402
from ridgeline.json_schemas import DEFAULT_BOUNDS  # noqa: E402

PROMPT = "Write a long description of the sea, in JSON."
LONG_ANSWER = {"type": "object", "properties": {"text": {"type": "string", "minLength": 4000, "maxLength": 5000}},
               "required": ["text"]}


def fifty_properties(salt: str = "") -> dict:
    kinds = [{"type": "string", "maxLength": 40}, {"type": "integer", "minimum": 0, "maximum": 1000},
             {"type": "boolean"}, {"type": "string", "enum": ["a", "b", "c"]}, {"type": "number"}]
    properties = {f"field_{i}{salt}": kinds[i % len(kinds)] for i in range(50)}
    return {"type": "object", "properties": properties, "required": list(properties)[:25], "additionalProperties": False}


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def vocabulary_seconds(llm: LLM) -> float:
    started = time.perf_counter()
    llm.engine.grammars.ll_tokenizer
    return round(time.perf_counter() - started, 3)


def compile_times(llm: LLM, repetitions: int) -> dict:
    grammars = llm.engine.grammars
    cold, cached = [], []
    for i in range(repetitions):
        spec = Structured(json=fifty_properties(f"_{time.monotonic_ns()}_{i}"))
        started = time.perf_counter()
        grammars.compile(spec)
        cold.append(time.perf_counter() - started)
        started = time.perf_counter()
        grammars.compile(spec)
        cached.append(time.perf_counter() - started)
    corpus = []
    for case in SCHEMAS:
        spec = Structured(json={**case.schema, "title": f"cold {time.monotonic_ns()}"})
        started = time.perf_counter()
        grammars.compile(spec)
        corpus.append(time.perf_counter() - started)
    return {"fifty_properties_cold_ms": median_ms(cold), "fifty_properties_cached_ms": median_ms(cached),
            "corpus_cold_median_ms": median_ms(corpus), "corpus_cold_max_ms": round(max(corpus) * 1000, 3)}


def mask_times(llm: LLM) -> dict:
    """Per row, over the positions of real answers (the corpus's first 20 schemas, greedy)."""
    from ridgeline.engine.structured.matcher import apply_grammar_masks  # here: --only decode runs on older trees
    grammars, vocab = llm.engine.grammars, llm.engine.model_config.vocab_size
    answers = run_corpus(llm, SCHEMAS[:20], temperatures=(0.0,), max_tokens=64)
    bitmask, argmax, unpack_argmax, sampled16 = [], [], [], []
    logits = torch.randn(vocab)
    best = int(np.argmax(logits.numpy()))
    work = torch.randn(16, vocab)
    for case, answer in zip(SCHEMAS[:20], answers):
        matcher = grammars.compile(Structured(json=case.schema)).matcher()
        for token in llm.tokenizer.encode(answer.text, add_bos=False)[:64]:
            started = time.perf_counter()
            matcher.compute()  # the worker's whole part for a row: llguidance's packed mask
            bitmask.append(time.perf_counter() - started)
            started = time.perf_counter()
            matcher.allows(token)  # a greedy row whose argmax the grammar allows: one bit read
            argmax.append(time.perf_counter() - started)
            started = time.perf_counter()
            matcher.masked_argmax(logits, best)  # a random row's argmax is rarely allowed: the bits unpacked
            unpack_argmax.append(time.perf_counter() - started)
            started = time.perf_counter()
            apply_grammar_masks(work, list(range(16)), [matcher.words()] * 16)  # 16 sampled rows, one op
            sampled16.append(time.perf_counter() - started)
            if not matcher.consume([token]):
                break
    return {"rows": len(bitmask), "llguidance_bitmask_ms": median_ms(bitmask),
            "greedy_allowed_argmax_ms": median_ms(argmax), "greedy_masked_argmax_forbidden_ms": median_ms(unpack_argmax),
            "sampled_16_rows_mask_ms": median_ms(sampled16)}


def decode_rate(llm: LLM, batch: int, constrained: bool, max_tokens: int, temperature: float = 0.0) -> float:
    params = SamplingParams(temperature=temperature, seed=None if temperature == 0 else 7, max_tokens=max_tokens,
                            ignore_eos=not constrained,
                            structured_outputs=Structured(json=LONG_ANSWER) if constrained else None)
    outputs = llm.generate([PROMPT] * batch, params, use_tqdm=False)
    first = min(out.timings.token_times[0] for out in outputs)
    last = max(out.timings.token_times[-1] for out in outputs)
    tokens = sum(len(out.output_token_ids) - 1 for out in outputs)
    assert all(len(out.output_token_ids) == max_tokens for out in outputs), "a constrained answer ended early"
    return tokens / (last - first)


def decode_times(llm: LLM, repetitions: int, max_tokens: int, temperatures: list[float]) -> dict:
    result = {}
    for batch in (1, 16):
        for temperature in temperatures:
            decode_rate(llm, batch, True, 8, temperature)  # warm-up: buffers of this batch size, the grammar compiled
            decode_rate(llm, batch, False, 8, temperature)
            masks = llm.engine.masks
            rates = {False: [], True: []}
            mask_seconds, wait_seconds, num_masks = masks.mask_seconds, masks.wait_seconds, masks.num_masks
            at_sampling = llm.engine.grammars.sampling_masks
            sampling_count, sampling_seconds = at_sampling.count, at_sampling.seconds
            for repetition in range(repetitions):
                # A B, B A, ...: the machine drifts over minutes, so neither side always runs first.
                for constrained in ((False, True) if repetition % 2 == 0 else (True, False)):
                    rates[constrained].append(decode_rate(llm, batch, constrained, max_tokens, temperature))
            rows = masks.num_masks - num_masks
            result[f"batch_{batch}" + ("" if temperature == 0 else f"_temperature_{temperature:g}")] = {
                "unconstrained_tok_s": round(statistics.median(rates[False]), 1),
                "constrained_tok_s": round(statistics.median(rates[True]), 1),
                "ratio": round(statistics.median(rates[True]) / statistics.median(rates[False]), 3),
                "ratios_per_repetition": [round(c / u, 3) for u, c in zip(rates[False], rates[True])],
                "median_of_repetition_ratios": round(statistics.median(c / u for u, c in zip(rates[False], rates[True])), 3),
                # Plain greedy rows and rows sampled with temperature alone get no mask on the worker, only where
                # the grammar refuses the token they chose, at sampling (engine/sampler.py): rows may be 0.
                "masks_at_sampling": at_sampling.count - sampling_count,
                "mask_ms_at_sampling_per_step": round((at_sampling.seconds - sampling_seconds) * 1000
                                                      / (repetitions * max_tokens), 4),
                "masks_on_worker": rows,
                "mask_ms_per_row_on_worker": round((masks.mask_seconds - mask_seconds) / max(rows, 1) * 1000, 3),
                "wait_ms_per_step": round((masks.wait_seconds - wait_seconds) / (max(rows, 1) / batch) * 1000, 3)}
    return result


def step_profile(llm: LLM, repetitions: int, max_tokens: int, batch: int = 16, temperature: float = 1.0) -> dict:
    engine = llm.engine
    parts = {"forward": 0.0, "sampler": 0.0, "grammar_advance": 0.0, "mask_wait": 0.0}
    masks, sampler = engine.masks, engine.sampler
    wrapped = []  # (owner, name, what the instance held under that name, or None where it was the class's method)

    def timed(owner, name: str, part: str) -> None:
        inner = getattr(owner, name)
        wrapped.append((owner, name, vars(owner).get(name)))

        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                parts[part] += time.perf_counter() - started
        setattr(owner, name, wrapper)

    step = engine.step
    steps = {"n": 0, "seconds": 0.0}

    def counted_step():
        started = time.perf_counter()
        try:
            return step()
        finally:
            steps["n"] += 1
            steps["seconds"] += time.perf_counter() - started
    wrapped.append((engine, "step", None))
    engine.step = counted_step
    timed(engine.runner, "forward", "forward")
    timed(engine, "sampler", "sampler")
    timed(engine, "_advance_grammars", "grammar_advance")
    timed(engine.masks, "wait", "mask_wait")
    result = {}
    try:
        decode_rate(llm, batch, True, 8, temperature)  # warm-up
        decode_rate(llm, batch, False, 8, temperature)
        totals = {False: dict.fromkeys([*parts, "step", "steps"], 0.0), True: dict.fromkeys([*parts, "step", "steps"], 0.0)}
        mask_seconds, num_masks = masks.mask_seconds, masks.num_masks
        drawn, redrawn = getattr(sampler, "num_drawn_unmasked", 0), getattr(sampler, "num_redrawn", 0)  # older trees: 0
        masked_redraws = getattr(sampler, "num_masked_redraws", 0)
        for _ in range(repetitions):
            for constrained in (False, True):
                for key in parts:
                    parts[key] = 0.0
                steps["n"], steps["seconds"] = 0, 0.0
                decode_rate(llm, batch, constrained, max_tokens, temperature)
                for key in parts:
                    totals[constrained][key] += parts[key]
                totals[constrained]["step"] += steps["seconds"]
                totals[constrained]["steps"] += steps["n"]
        for constrained, total in totals.items():
            n = total["steps"]
            row = {f"{key}_ms": round(total[key] / n * 1000, 3) for key in (*parts, "step")}
            row["other_ms"] = round((total["step"] - sum(total[key] for key in parts)) / n * 1000, 3)
            row["steps"] = int(n)
            result["constrained" if constrained else "unconstrained"] = row
        result["mask_worker_ms_per_step"] = round((masks.mask_seconds - mask_seconds) * 1000 /
                                                  max(1, (masks.num_masks - num_masks) / batch), 3)
        drawn = getattr(sampler, "num_drawn_unmasked", 0) - drawn
        result["constrained_draws_refused"] = f"{getattr(sampler, 'num_redrawn', 0) - redrawn} of {drawn}"
        result["refused_eight_times_drawn_masked"] = getattr(sampler, "num_masked_redraws", 0) - masked_redraws
    finally:
        for owner, name, held in wrapped:
            if held is None:
                delattr(owner, name)  # the instance's wrapper goes: the class's method again
            else:
                setattr(owner, name, held)
    return {f"batch_{batch}_temperature_{temperature:g}": result}


def ttft_times(llm: LLM, repetitions: int) -> dict:
    def once(structured: Structured | None) -> float:
        started = time.perf_counter()
        llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, structured_outputs=structured), use_tqdm=False)
        return time.perf_counter() - started

    plain, cold, cached = [], [], []
    for i in range(repetitions):
        spec = Structured(json=fifty_properties(f"_ttft_{time.monotonic_ns()}_{i}"))
        plain.append(once(None))
        cold.append(once(spec))
        cached.append(once(spec))
    return {"unconstrained_ms": median_ms(plain), "cold_grammar_ms": median_ms(cold), "cached_grammar_ms": median_ms(cached)}


def validity(llm: LLM, max_tokens_list: list[int]) -> list[dict]:
    grammars = llm.engine.grammars
    modes = {"as sent (vLLM's behaviour)": (None, False), "bounds only": (DEFAULT_BOUNDS, False),
             "closing only": (None, True), "bounds + closing (default)": (DEFAULT_BOUNDS, True)}
    rows = []
    for max_tokens in max_tokens_list:
        for mode, (bounds, close) in modes.items():
            grammars.json_bounds, grammars.close_json = bounds, close
            started = time.perf_counter()
            answers = run_corpus(llm, SCHEMAS, temperatures=(0.0, 1.0), max_tokens=max_tokens)
            finished = [a for a in answers if a.finish_reason == "stop"]
            rows.append({"max_tokens": max_tokens, "mode": mode, "answers": len(answers), "finished": len(finished),
                         "valid_of_finished": sum(bool(a.valid) for a in finished),
                         "valid_and_finished": round(sum(bool(a.valid) for a in finished) / len(answers), 3),
                         "unfinished": sorted({a.case for a in answers if a.finish_reason != "stop"}),
                         "invalid": [(a.case, a.temperature, a.problem) for a in finished if not a.valid],
                         "seconds": round(time.perf_counter() - started, 1)})
            print(json.dumps(rows[-1]), flush=True)
    grammars.json_bounds, grammars.close_json = DEFAULT_BOUNDS, True
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128, help="decode length of the tok/s runs")
    parser.add_argument("--validity", default="96,192", help="max_tokens of the corpus runs")
    parser.add_argument("--skip-validity", action="store_true")
    parser.add_argument("--temperatures", default="0,1", help="temperatures of the decode tok/s runs")
    parser.add_argument("--only", help="comma-separated sections to run (vocabulary always): "
                                       "compile,mask,decode,ttft,profile,validity")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--lock-held", action="store_true",
                        help="the caller holds /tmp/ridgeline-cpu.lock already (a before/after driver running this "
                             "on two trees in turn); do not take it again")
    args = parser.parse_args()
    with open(CPU_LOCK, "a") as lock:
        if not args.lock_held:
            fcntl.flock(lock, fcntl.LOCK_EX)
        started = datetime.datetime.now().astimezone()
        llm = LLM()
        report = {"started": started.isoformat(timespec="seconds"), "machine": platform.processor() or platform.machine(),
                  "torch_threads": torch.get_num_threads(), "model": llm.engine.model_name,
                  "vocab_size": llm.engine.model_config.vocab_size}
        report["vocabulary_s"] = vocabulary_seconds(llm)
        print(json.dumps(report), flush=True)
        only = None if args.only is None else set(args.only.split(","))
        temperatures = [float(t) for t in args.temperatures.split(",")]
        for name, measure in (("compile", lambda: compile_times(llm, args.repetitions)), ("mask", lambda: mask_times(llm)),
                              ("decode", lambda: decode_times(llm, args.repetitions, args.max_tokens, temperatures)),
                              ("ttft", lambda: ttft_times(llm, args.repetitions)),
                              ("profile", lambda: step_profile(llm, args.repetitions, args.max_tokens))):
            if only is None or name in only:
                report[name] = measure()
                print(json.dumps({name: report[name]}), flush=True)
        if not args.skip_validity and (only is None or "validity" in only):
            report["validity"] = validity(llm, [int(n) for n in args.validity.split(",")])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
