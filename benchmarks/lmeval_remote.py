"""lm-eval against `ridgeline serve`, tokenizing through the server: no tokenizer files on the client side.

    python benchmarks/lmeval_remote.py [--model PATH] [--limit N] [--threads 2] [--compare-llamacpp]

Starts the server on a free port, runs lm-eval's `local-completions` model with `tokenizer_backend=remote` (it
reads /tokenizer_info and tokenizes through /tokenize and /detokenize) on the multiple-choice task in
benchmarks/lmeval/ (20 questions, data in the repository: nothing is downloaded), and prints lm-eval's table.
Each choice is scored by its log-likelihood after the question, from /v1/completions with echo + logprobs.

lm-eval and its heavy dependencies (datasets, transformers, ...) live in their own environment,
benchmarks/.venv-lmeval, built on first use (or by hand:
`python3 -m venv benchmarks/.venv-lmeval && benchmarks/.venv-lmeval/bin/pip install "lm-eval[api]==0.4.13"`).

`--compare-llamacpp` also scores every (question, choice) pair lm-eval sent with llama.cpp (llama-cpp-python in
its own venv, llamacpp_env.py; lmeval_llamacpp_scores.py tokenizes each pair as lm-eval does, with llama.cpp's
tokenizer) and compares: the per-choice |delta| in nats, each question's argmax, and whether the server's
/tokenize gave the same ids as llama.cpp's tokenizer. Writes benchmarks/results/lmeval_remote/lmeval_remote.json.
"""

import argparse
import glob
import json
import os
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import httpx
from private_venv import private_python
from ridgeline.bench.served import ridgeline_server
from ridgeline.model.checkpoint import resolve_model_path

LM_EVAL = "lm-eval[api]==0.4.13"  # [api]: the HTTP client models (local-completions)
HERE = Path(__file__).resolve().parent
VENV_DIR = HERE / ".venv-lmeval"
PIP_LOCK = Path("/tmp/ridgeline-pip.lock")
SERVED_NAME = "ridgeline"
RESULTS = HERE / "results" / "lmeval_remote"
SCORER = HERE / "lmeval_llamacpp_scores.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N questions")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None, help="write lm-eval's results JSON under this folder")
    parser.add_argument("--compare-llamacpp", action="store_true",
                        help="score the same pairs with llama.cpp and write the comparison under results/")
    args = parser.parse_args()
    python = private_python(VENV_DIR, LM_EVAL, "lm_eval, tenacity", PIP_LOCK)
    output = args.output or (tempfile.mkdtemp(prefix="lmeval-remote-") if args.compare_llamacpp else None)
    serve_args = ["--served-model-name", SERVED_NAME, "--threads", str(args.threads), "--kv-cache-memory", "256MiB"]
    with ridgeline_server(*serve_args, *([args.model] if args.model else [])) as (url, _):
        model_args = (f"model={SERVED_NAME},base_url={url}/v1/completions,tokenizer_backend=remote,"
                      f"num_concurrent=1,max_retries=1")
        command = [str(python), "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
                   "--tasks", "ridgeline_mc", "--include_path", str(HERE / "lmeval"), "--batch_size", "1"]
        command += ["--limit", str(args.limit)] if args.limit else []
        command += ["--output_path", output, "--log_samples"] if output else []
        # The task's data path is relative to the repository root; offline: nothing may be fetched from a hub.
        env = os.environ | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": "unused"}
        subprocess.run(command, check=True, cwd=HERE.parent, env=env)
        if args.compare_llamacpp:
            samples = read_samples(output)
            pairs = [pair for sample in samples for pair in sample["pairs"]]
            # what lm-eval's remote tokenizer got for each pair (lm-eval keeps no ids in its samples)
            with httpx.Client(base_url=url, timeout=60) as client:
                served_ids = [encode_pair(client, context, continuation) for context, continuation in pairs]
                # lm-eval sends no BOS (see log.md); the same pairs after the BOS, scored by the server directly
                bos = client.post("/tokenize", json={"prompt": "<bos>", "add_special_tokens": False}).json()["tokens"]
                with_bos = [served_loglik(client, bos + head, tail) for head, tail in served_ids]
    if args.compare_llamacpp:
        compare(args, samples, pairs, served_ids, with_bos)


def read_samples(output: str) -> list[dict]:
    """Each question lm-eval scored: its (context, continuation) pairs, their log-likelihoods, the answer index."""
    found = glob.glob(os.path.join(output, "**", "samples_ridgeline_mc_*.jsonl"), recursive=True)
    if not found:
        raise SystemExit(f"lm-eval wrote no samples under {output}")
    samples = []
    for line in Path(sorted(found)[-1]).read_text().splitlines():
        record = json.loads(line)
        arguments = record["arguments"]
        arguments = list(arguments.values()) if isinstance(arguments, dict) else arguments
        pairs = [[a["arg_0"], a["arg_1"]] if isinstance(a, dict) else list(a[:2]) for a in arguments]
        logliks = [float(r[0][0]) for r in record["resps"]]
        samples.append({"doc_id": record["doc_id"], "target": int(record["target"]), "pairs": pairs,
                        "ridgeline": logliks})
    return sorted(samples, key=lambda s: s["doc_id"])


def encode_pair(client: httpx.Client, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's _encode_pair through the server's /tokenize (add_special_tokens=false, as its remote tokenizer)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]

    def encode(text: str) -> list[int]:
        answer = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
        answer.raise_for_status()
        return answer.json()["tokens"]

    whole, head = encode(context + continuation), encode(context)
    return head, whole[len(head):]


def served_loglik(client: httpx.Client, head: list[int], tail: list[int]) -> float:
    """The continuation's log-likelihood from /v1/completions with echo + logprobs, as lm-eval asks for it."""
    answer = client.post("/v1/completions", json={"model": SERVED_NAME, "prompt": head + tail, "max_tokens": 1,
                                                  "temperature": 0, "logprobs": 1, "echo": True})
    answer.raise_for_status()
    logprobs = answer.json()["choices"][0]["logprobs"]["token_logprobs"]
    return float(sum(logprobs[len(head):len(head) + len(tail)]))


def llamacpp_scores(args, pairs: list[list[str]], bos: bool) -> dict:
    from llamacpp_env import llamacpp_python

    job = json.dumps({"model": str(resolve_model_path(args.model)), "threads": args.threads, "pairs": pairs,
                      "bos": bos})
    done = subprocess.run([str(llamacpp_python()), str(SCORER)], input=job, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def compare(args, samples: list[dict], pairs: list[list[str]], served_ids: list[tuple[list[int], list[int]]],
            with_bos: list[float]) -> None:
    model = str(resolve_model_path(args.model))
    reference = llamacpp_scores(args, pairs, bos=False)
    reference_bos = [score["loglik"] for score in llamacpp_scores(args, pairs, bos=True)["scores"]]
    scores = iter(reference["scores"])
    rows, same_ids = [], 0
    served = iter(served_ids)
    for sample in samples:
        theirs = []
        for _ in sample["pairs"]:
            score, ids = next(scores), next(served)
            same_ids += [score["context_ids"], score["continuation_ids"]] == [ids[0], ids[1]]
            theirs.append(score["loglik"])
        ours = sample["ridgeline"]
        rows.append({"doc_id": sample["doc_id"], "target": sample["target"], "ridgeline": ours, "llamacpp": theirs,
                     "max_abs_delta": max(abs(a - b) for a, b in zip(ours, theirs)),
                     "argmax_ridgeline": ours.index(max(ours)), "argmax_llamacpp": theirs.index(max(theirs))})
    deltas = [abs(a - b) for row in rows for a, b in zip(row["ridgeline"], row["llamacpp"])]
    summary = {
        "questions": len(rows), "choices": len(deltas),
        "max_abs_delta_nats": max(deltas), "mean_abs_delta_nats": sum(deltas) / len(deltas),
        "argmax_agree": sum(r["argmax_ridgeline"] == r["argmax_llamacpp"] for r in rows),
        "acc_ridgeline": sum(r["argmax_ridgeline"] == r["target"] for r in rows) / len(rows),
        "acc_llamacpp": sum(r["argmax_llamacpp"] == r["target"] for r in rows) / len(rows),
        "pairs_same_token_ids": same_ids,
        # the same pairs after the BOS (not what lm-eval sends): ridgeline's /v1/completions against llama.cpp
        "with_bos": bos_summary(with_bos, reference_bos, [len(s["pairs"]) for s in samples]),
    }
    result = {"benchmark": "lmeval_remote", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "lm_eval": LM_EVAL, "model_args": "local-completions, tokenizer_backend=remote", "model": model,
              "llama_cpp_python": reference["llama_cpp_python"], "threads": args.threads,
              "machine": "AMD EPYC, AVX2 only, 2 shared cores", "summary": summary, "questions": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lmeval_remote.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def bos_summary(ours: list[float], theirs: list[float], choices_per_question: list[int]) -> dict:
    deltas = [abs(a - b) for a, b in zip(ours, theirs)]
    agree, start = 0, 0
    for count in choices_per_question:
        a, b = ours[start:start + count], theirs[start:start + count]
        agree += a.index(max(a)) == b.index(max(b))
        start += count
    return {"max_abs_delta_nats": max(deltas), "mean_abs_delta_nats": sum(deltas) / len(deltas),
            "argmax_agree": agree, "ridgeline": ours, "llamacpp": theirs}


if __name__ == "__main__":
    main()
