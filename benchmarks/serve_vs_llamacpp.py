"""ridgeline serve vs llama.cpp's servers, side by side on one machine and model: N concurrent streams.

    .venv/bin/python benchmarks/serve_vs_llamacpp.py [--concurrency 8] [--num-prompts 16] [--threads 2] [--model PATH] [--json]

Three servers run in turn on a loopback port with the same model and thread count, each loaded by
`ridgeline bench serve`'s library (≈96-token prompts, 128 output tokens, greedy) after a short warm-up:
  - ridgeline serve, with --max-num-seqs CONCURRENCY;
  - llama.cpp's C++ llama-server with CONCURRENCY parallel slots (-np), the peer the target is set against
    (built on first use into benchmarks/.llamacpp-tools by llamacpp_tools.py);
  - llama-cpp-python[server] (benchmarks/.venv-llamacpp, built on first use), which decodes one request at a time.
The whole run holds /tmp/ridgeline-cpu.lock so nothing else shares the CPUs.

Target (issue 5): ridgeline >= 1.5x llama-server's aggregate output tok/s, with mean TTFT and p99 ITL no worse.
(An earlier llama-server -np 8 measurement on this machine is in shared/reference/README.md.)
"""

import argparse
import contextlib
import fcntl
import json
import subprocess
import sys
from pathlib import Path

from llamacpp_env import CPU_LOCK, LLAMA_CPP_PYTHON, llamacpp_python
from llamacpp_tools import llama_server
from served_peers import figures, measure, print_table

import ridgeline.bench.bench_serve as bench_serve_library
from ridgeline.bench.served import free_port
from ridgeline.model.checkpoint import read_checkpoint, resolve_model_path

THROUGHPUT_TARGET = 2.5  # x llama-server's aggregate output tok/s (issue 16; 1.5 before it)


def ridgeline_command(model: Path, port: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-c", "from ridgeline.cli import main; main()", "serve", str(model), "--port", str(port),
            "--threads", str(args.threads), "--max-num-seqs", str(args.concurrency), "--kv-cache-memory", "512MiB"]


def llama_server_command(binary: Path, model: Path, port: int, args: argparse.Namespace) -> list[str]:
    # llama-server splits its context evenly over the slots, each a multiple of 256 tokens; 2x the words leaves
    # room for words of several tokens.
    slot_context = -(-2 * (args.input_len + args.output_len) // 256) * 256
    context = args.concurrency * slot_context
    return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
            "-np", str(args.concurrency), "-c", str(context)]


def llamacpp_python_command(python: Path, model: Path, port: int, args: argparse.Namespace) -> list[str]:
    return [str(python), "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "4096",
            "--interrupt_requests", "False"]  # by default a new request cuts the running stream short


def with_server_extras(python: Path) -> Path:
    """llama-cpp-python's server needs its [server] extras (pure Python: no rebuild of llama.cpp)."""
    if subprocess.run([python, "-c", "import llama_cpp.server.app"], capture_output=True).returncode != 0:
        extras = LLAMA_CPP_PYTHON.replace("==", "[server]==")
        subprocess.run([python, "-m", "pip", "install", "-q", extras], check=True)
    return python


@contextlib.contextmanager
def banned_end_tokens(token_ids: list[int]):
    """llama-cpp-python ignores vLLM's `ignore_eos`: ban the end-of-generation tokens with `logit_bias` instead, so
    that it too writes output_len tokens per request. Scoped to its measurement; ridgeline gets plain requests."""
    plain = bench_serve_library.request_body

    def with_bias(*args, **kwargs) -> dict:
        return plain(*args, **kwargs) | {"logit_bias": {str(token): -100 for token in token_ids}}

    bench_serve_library.request_body = with_bias
    try:
        yield
    finally:
        bench_serve_library.request_body = plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled Gemma 3 270M Q4_K_M)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every server")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent streams (and llama-server's slots)")
    parser.add_argument("--num-prompts", type=int, default=16, help="requests per server")
    parser.add_argument("--input-len", type=int, default=96, help="prompt length in words (≈ tokens)")
    parser.add_argument("--output-len", type=int, default=128, help="output tokens per request")
    parser.add_argument("--max-seconds", type=float, default=600, help="time limit per server")
    parser.add_argument("--log-dir", default="/tmp", help="where the servers' logs go")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--no-llama-cpp-python", action="store_true",
                        help="leave out llama-cpp-python's server (one request at a time: not the peer the target is "
                             "set against), and the ~8 min build of its environment")
    args = parser.parse_args()
    model = resolve_model_path(args.model)
    # Both build on first use (taking the CPU lock themselves), before the measurements take it.
    binary = llama_server()
    python = None if args.no_llama_cpp_python else with_server_extras(llamacpp_python())

    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = {
            "ridgeline": measure("ridgeline", ridgeline_command(model, free_port(), args), "/health", args),
            "llama-server": measure("llama-server", llama_server_command(binary, model, free_port(), args),
                                    "/health", args),
        }
        if python is not None:
            with banned_end_tokens(sorted(read_checkpoint(model).load_tokenizer().eos_ids)):
                results["llama-cpp-python"] = measure(
                    "llama-cpp-python", llamacpp_python_command(python, model, free_port(), args), "/v1/models", args)
    results = {name: figures(level) for name, level in results.items()}

    ours, peer = results["ridgeline"], results["llama-server"]
    ratio = ours["output_tokens_per_s"] / peer["output_tokens_per_s"]
    verdict = {
        "throughput": ratio >= THROUGHPUT_TARGET,
        "ttft_mean": ours["ttft_mean_ms"] <= peer["ttft_mean_ms"],
        "itl_p99": ours["itl_p99_ms"] <= peer["itl_p99_ms"],
    }
    if args.json:
        print(json.dumps(results | {"throughput_ratio_vs_llama_server": ratio, "target_met": verdict}, indent=2))
        return
    print(f"{model.name}: {args.concurrency} concurrent streams, {args.num_prompts} requests, "
          f"{args.input_len}-word prompts, {args.output_len} tokens out, {args.threads} threads")
    print_table(results)
    print(f"throughput ratio vs llama-server: {ratio:.2f}x (target {THROUGHPUT_TARGET}x); "
          + ", ".join(f"{k}: {'met' if ok else 'missed'}" for k, ok in verdict.items()))


if __name__ == "__main__":
    main()
