"""xgrammar against llguidance on this CPU, with the default model's vocabulary (Gemma 3 270M, 262,144 tokens): what
each costs to build the vocabulary, to compile a 50-property JSON schema, and per decode step for a mask.

    .venv/bin/python benchmarks/grammar_engines.py [--repetitions 5] [--json FILE]

llguidance is measured in ridgeline's own environment through the engine's GrammarCompiler (exactly what serving
does: bounds, strict objects, the same separators). xgrammar runs in a private environment (benchmarks/.venv-xgrammar,
built on first use: xgrammar needs torch, transformers and tvm-ffi, which ridgeline's CPU install does not) given
the same token bytes, the same control and end tokens and the same schema, compiled with the same separators and
no free whitespace (what ridgeline's JSON grammars allow). Both walk the same path: the tokens of one valid answer
to the schema, a mask at every step (median, 90th percentile); and the masks of 16 such rows, one batch.
Everything under /tmp/ridgeline-cpu.lock, one library after the other.
"""

import argparse
import datetime
import fcntl
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV_DIR = HERE / ".venv-xgrammar"
PIP_LOCK = Path("/tmp/ridgeline-pip.lock")
CPU_LOCK = Path("/tmp/ridgeline-cpu.lock")
XGRAMMAR = "xgrammar==0.2.8"
# torch from the CPU wheels: PyPI's default torch is the CUDA build, gigabytes this machine would never use.
XGRAMMAR_PIP_ARGS = ("torch==2.13.0+cpu",)
BATCH = 16


def fifty_properties(salt: str = "") -> dict:
    kinds = [{"type": "string", "maxLength": 40}, {"type": "integer", "minimum": 0, "maximum": 1000},
             {"type": "boolean"}, {"type": "string", "enum": ["a", "b", "c"]}, {"type": "number"}]
    properties = {f"field_{i}{salt}": kinds[i % len(kinds)] for i in range(50)}
    return {"type": "object", "properties": properties, "required": list(properties)[:25], "additionalProperties": False}


def fifty_answer(salt: str = "") -> str:
    """A valid answer with every property, in the separators both grammars are given (", " and ": ")."""
    values = ["a short text", 417, True, "b", 3.25]
    answer = {f"field_{i}{salt}": values[i % len(values)] for i in range(50)}
    return json.dumps(answer, separators=(", ", ": "))


def summary(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {"median_ms": round(statistics.median(ordered) * 1000, 4),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 4), "steps": len(ordered)}


def measure_llguidance(llm, path: list[int], repetitions: int) -> dict:
    import numpy as np
    from ridgeline.engine.structured import StructuredOutputsParams as Structured
    from ridgeline.engine.structured.masks import EXECUTOR_THREADS
    from ridgeline.engine.structured.matcher import fill_masks
    import llguidance

    grammars = llm.engine.grammars
    started = time.perf_counter()
    grammars.ll_tokenizer  # built once per engine
    vocabulary = time.perf_counter() - started
    cold = []
    for i in range(repetitions):
        spec = Structured(json=fifty_properties(f"_ll{i}_{time.monotonic_ns()}"))
        started = time.perf_counter()
        grammars.compile(spec)
        cold.append(time.perf_counter() - started)
    compiled = grammars.compile(Structured(json=fifty_properties()))
    matcher, steps = compiled.matcher(), []
    for token in path:
        started = time.perf_counter()
        matcher.compute()
        steps.append(time.perf_counter() - started)
        assert matcher.allows(token), "the answer's token is refused"
        matcher.consume([token])
    matchers = [compiled.matcher() for _ in range(BATCH)]
    executor, batches = llguidance.LLExecutor(num_threads=EXECUTOR_THREADS), []
    for token in path:
        started = time.perf_counter()
        fill_masks(executor, matchers)  # what the engine's mask worker does for a step of 16 constrained rows
        batches.append(time.perf_counter() - started)
        for m in matchers:
            m.consume([token])
    assert all(np.count_nonzero(m.words()) for m in matchers)
    return {"version": metadata.version("llguidance"),
            "vocabulary_s": round(vocabulary, 3), "fifty_properties_cold_ms": round(statistics.median(cold) * 1000, 3),
            "mask_per_step": summary(steps), f"mask_batch_{BATCH}": summary(batches)}


def xgrammar_worker(data_file: Path) -> None:
    """Runs in the private environment: xgrammar only."""
    import numpy as np
    import xgrammar

    data = json.loads(data_file.read_text())
    vocab, path, repetitions = data["vocab_size"], data["path"], data["repetitions"]
    tokens = [bytes.fromhex(t) for t in data["tokens"]]
    started = time.perf_counter()
    info = xgrammar.TokenizerInfo(tokens, xgrammar.VocabType.RAW,
                                  vocab_size=vocab, stop_token_ids=data["eos_ids"])
    compiler = xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False)  # 2: this machine's cores
    vocabulary = time.perf_counter() - started
    schema = data["schema"]
    options = dict(any_whitespace=False, separators=(", ", ": "), strict_mode=True)
    cold = []
    for i in range(repetitions):
        salted = json.loads(json.dumps(schema).replace('"field_', f'"f{i}_field_'))
        started = time.perf_counter()
        compiler.compile_json_schema(json.dumps(salted), **options)
        cold.append(time.perf_counter() - started)
    compiled = compiler.compile_json_schema(json.dumps(schema), **options)
    matcher, bitmask, steps = xgrammar.GrammarMatcher(compiled), xgrammar.allocate_token_bitmask(1, vocab), []
    for token in path:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        steps.append(time.perf_counter() - started)
        assert (int(bitmask[0, token >> 5]) >> (token & 31)) & 1, "the answer's token is refused"
        assert matcher.accept_token(token)
    matchers = [xgrammar.GrammarMatcher(compiled) for _ in range(BATCH)]
    batch_mask, batches = xgrammar.allocate_token_bitmask(BATCH, vocab), []
    for token in path:
        started = time.perf_counter()
        for row, m in enumerate(matchers):  # one thread, as ridgeline's mask worker runs
            m.fill_next_token_bitmask(batch_mask, row)
        batches.append(time.perf_counter() - started)
        for m in matchers:
            m.accept_token(token)
    assert np.count_nonzero(batch_mask.numpy())
    print(json.dumps({"version": metadata.version("xgrammar"),
                      "vocabulary_s": round(vocabulary, 3),
                      "fifty_properties_cold_ms": round(statistics.median(cold) * 1000, 3),
                      "mask_per_step": summary(steps), f"mask_batch_{BATCH}": summary(batches)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--xgrammar-worker", type=Path, help=argparse.SUPPRESS)  # the private environment's part
    args = parser.parse_args()
    if args.xgrammar_worker is not None:
        xgrammar_worker(args.xgrammar_worker)
        return

    from private_venv import private_python
    from ridgeline.engine.llm import LLM

    python = private_python(VENV_DIR, XGRAMMAR, "xgrammar", PIP_LOCK, note=" (pulls torch CPU and transformers)",
                            pip_args=XGRAMMAR_PIP_ARGS)
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = datetime.datetime.now().astimezone()
        llm = LLM()
        tokenizer, vocab = llm.tokenizer, llm.engine.model_config.vocab_size
        known = min(tokenizer.vocab_size, vocab)
        # Control tokens (and padding rows) as empty byte strings: never matched as text, as llguidance is told.
        tokens = [b"" if tokenizer.is_special(i) else tokenizer.token_bytes(i) for i in range(known)]
        tokens += [b""] * (vocab - known)
        path = tokenizer.encode(fifty_answer(), add_bos=False)
        report = {"started": started.isoformat(timespec="seconds"), "machine": platform.processor() or platform.machine(),
                  "model": llm.engine.model_name, "vocab_size": vocab, "answer_tokens": len(path),
                  "llguidance": measure_llguidance(llm, path, args.repetitions)}
        print(json.dumps({"llguidance": report["llguidance"]}), flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "vocabulary.json"
            data.write_text(json.dumps({"vocab_size": vocab, "tokens": [t.hex() for t in tokens], "path": path,
                                        "eos_ids": sorted(tokenizer.eos_ids), "schema": fifty_properties(),
                                        "repetitions": args.repetitions}))
            done = subprocess.run([python, __file__, "--xgrammar-worker", str(data)], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"xgrammar worker failed:\n{done.stderr}")
        report["xgrammar"] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps({"xgrammar": report["xgrammar"]}), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
