"""Constrained decoding against llama.cpp's server: the same JSON schema (OpenAI's `response_format`, which
llama-server turns into a GBNF grammar and ridgeline into an llguidance one) on the same model, one request at a
time, decode tok/s with and without the schema on each engine.

    python benchmarks/structured_vs_llamacpp.py [--rounds 8] [--max-tokens 64] [--json-out FILE]

Both servers run side by side (an idle one costs nothing) and the repetitions are interleaved — each round asks
the engines in alternating order, each engine constrained and free in alternating order — and medians are taken:
this machine drifts by 30 % over minutes. Decode tok/s is per request, (tokens - 1) / (last - first token time)
from the stream, so the prompt's prefill is left out. Greedy, so both engines are asked the same thing each time.
"""

import argparse
import fcntl
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from llamacpp_env import CPU_LOCK
from llamacpp_tools import llama_server
from served_peers import wait_until_ready

from ridgeline.bench.served import free_port
from ridgeline.model.checkpoint import resolve_model_path

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 40}, "languages": {"type": "array", "items": {"type": "string",
                                                                                          "maxLength": 20},
                                                               "maxItems": 3},
    "employed": {"type": "boolean"}}, "required": ["name", "age", "city", "languages", "employed"],
    "additionalProperties": False}
PROMPTS = ["Describe a person who lives in Lisbon as JSON.", "Invent a software engineer and describe them as JSON.",
           "Give me a JSON record of a retired teacher.", "A JSON profile of a student in Nairobi, please."]


def decode_rate(url: str, prompt: str, constrained: bool, max_tokens: int) -> tuple[float, int]:
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    times = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    if len(times) < 3:
        return float("nan"), len(times)
    return (len(times) - 1) / (times[-1] - times[0]), len(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled Gemma 3 270M Q4_K_M)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    model = resolve_model_path(args.model)
    binary = llama_server()
    ports = {"ridgeline": free_port(), "llama-server": free_port()}
    commands = {
        "ridgeline": [sys.executable, "-c", "from ridgeline.cli import main; main()", "serve", str(model), "--port",
                      str(ports["ridgeline"]), "--threads", str(args.threads)],
        # One slot: one request at a time, as measured; --jinja for the model's chat template.
        "llama-server": [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(ports["llama-server"]),
                         "-t", str(args.threads), "-np", "1", "-c", "4096", "--jinja"],
    }
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        servers = {name: subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for name, command in commands.items()}
        try:
            urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
            for name, server in servers.items():
                wait_until_ready(server, urls[name] + "/health", f"{name} did not start")
                for constrained in (False, True):  # warm-up: kernels, the grammar cache, llama.cpp's first graph
                    decode_rate(urls[name], PROMPTS[0], constrained, 8)
            rates = {(name, constrained): [] for name in urls for constrained in (False, True)}
            tokens = {key: [] for key in rates}
            for round_index in range(args.rounds):
                order = list(urls) if round_index % 2 == 0 else list(urls)[::-1]
                for name in order:
                    for constrained in ((False, True) if round_index % 2 == 0 else (True, False)):
                        rate, count = decode_rate(urls[name], PROMPTS[round_index % len(PROMPTS)], constrained,
                                                  args.max_tokens)
                        rates[(name, constrained)].append(rate)
                        tokens[(name, constrained)].append(count)
        finally:
            for server in servers.values():
                server.terminate()
                server.wait()
    results = {}
    for name in urls:
        free = statistics.median(rates[(name, False)])
        bound = statistics.median(rates[(name, True)])
        results[name] = {"free_tok_s": round(free, 1), "constrained_tok_s": round(bound, 1),
                         "constrained_over_free": round(bound / free, 3),
                         "constrained_tokens_median": statistics.median(tokens[(name, True)])}
    results["ridgeline_over_llama_server_constrained"] = round(
        results["ridgeline"]["constrained_tok_s"] / results["llama-server"]["constrained_tok_s"], 3)
    results["rounds"], results["threads"], results["model"] = args.rounds, args.threads, Path(model).name
    print(json.dumps(results, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
