"""lm-eval against `ridgeline serve`, tokenizing through the server: no tokenizer files on the client side.

    python benchmarks/lmeval_remote.py [--model PATH] [--limit N] [--threads 2]

Starts the server on a free port, runs lm-eval's `local-completions` model with `tokenizer_backend=remote` (it
reads /tokenizer_info and tokenizes through /tokenize and /detokenize) on the multiple-choice task in
benchmarks/lmeval/ (20 questions, data in the repository: nothing is downloaded), and prints lm-eval's table.
Each choice is scored by its log-likelihood after the question, from /v1/completions with echo + logprobs.

lm-eval and its heavy dependencies (datasets, transformers, ...) live in their own environment,
benchmarks/.venv-lmeval, built on first use (or by hand:
`python3 -m venv benchmarks/.venv-lmeval && benchmarks/.venv-lmeval/bin/pip install "lm-eval[api]==0.4.13"`).
"""

import argparse
import os
import subprocess
from pathlib import Path

from private_venv import private_python
from ridgeline.bench.served import ridgeline_server

LM_EVAL = "lm-eval[api]==0.4.13"  # [api]: the HTTP client models (local-completions)
HERE = Path(__file__).resolve().parent
VENV_DIR = HERE / ".venv-lmeval"
PIP_LOCK = Path("/tmp/ridgeline-pip.lock")
SERVED_NAME = "ridgeline"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N questions")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None, help="write lm-eval's results JSON under this folder")
    args = parser.parse_args()
    python = private_python(VENV_DIR, LM_EVAL, "lm_eval, tenacity", PIP_LOCK)
    serve_args = ["--served-model-name", SERVED_NAME, "--threads", str(args.threads), "--kv-cache-memory", "256MiB"]
    with ridgeline_server(*serve_args, *([args.model] if args.model else [])) as (url, _):
        model_args = (f"model={SERVED_NAME},base_url={url}/v1/completions,tokenizer_backend=remote,"
                      f"num_concurrent=1,max_retries=1")
        command = [str(python), "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
                   "--tasks", "ridgeline_mc", "--include_path", str(HERE / "lmeval"), "--batch_size", "1"]
        command += ["--limit", str(args.limit)] if args.limit else []
        command += ["--output_path", args.output] if args.output else []
        # The task's data path is relative to the repository root; offline: nothing may be fetched from a hub.
        env = os.environ | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": "unused"}
        subprocess.run(command, check=True, cwd=HERE.parent, env=env)


if __name__ == "__main__":
    main()
