"""Does a disaggregated decode worker find a prompt's pages again? Pages moved for a repeat and a shared prefix.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/disagg_prefix_reuse.py \
        --baseline-src /path/to/older/checkout --json benchmarks/results/disagg_prefix_reuse/RUN.json

Starts `ridgeline serve --role prefill` and `--role decode` (--threads 1 each) behind `ridgeline proxy`, on the
default model (Gemma 3 270M: 5 sliding-window layer groups of 512 tokens, one full-attention group), and for each
prompt length N of --prompt-tokens (token ids, so every run sends the same tokens) sends, greedily, one after the
other: the prompt; the same prompt again; and a prompt sharing its first --shared-tokens tokens, N long. Before each
it asks the decode worker's /v1/kv/lookup how many tokens it holds, and after each it reads how many pages the
decode worker pulled (`ridgeline_kv_transfer_pages_received`). Issue 32: on a model with sliding-window layers a
prompt longer than the window was never found again after its transfer (799 tokens: ~210 pages pulled every time);
a repeat should move 0 pages, and a shared prefix only the pages the decode worker lacks.

With --baseline-src (a checkout of an older commit) the same is run on that checkout's workers, in the same run.
"""

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ridgeline.bench.bench_serve import FILLER_WORDS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disagg_vs_colocated import start  # noqa: E402 - the one way the benchmarks start a server

METRIC = "ridgeline_kv_transfer_pages_received_total"  # a Prometheus counter


def pages_received(client: httpx.Client, decode_url: str) -> float:
    text = client.get(f"{decode_url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(METRIC + "{") or line.startswith(METRIC + " "))


def token_ids(client: httpx.Client, url: str, seed: int, count: int, bos: bool) -> list[int]:
    """count token ids of filler text drawn from seed (with the model's BOS first if bos)."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(FILLER_WORDS) for _ in range(count))
    tokens = client.post(f"{url}/tokenize", json={"prompt": text, "add_special_tokens": bos}).json()["tokens"]
    if len(tokens) < count:
        raise RuntimeError(f"filler text of {count} words gave only {len(tokens)} tokens")
    return tokens[:count]


def send(client: httpx.Client, proxy_url: str, decode_url: str, model: str, prompt: list[int],
         max_tokens: int) -> dict:
    looked = client.post(f"{decode_url}/v1/kv/lookup", json={"prompt": prompt}).json()
    before = pages_received(client, decode_url)
    started = time.perf_counter()
    answer = client.post(f"{proxy_url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                               "temperature": 0})
    answer.raise_for_status()
    seconds = time.perf_counter() - started
    return {"prompt_tokens": len(prompt), "cached_tokens_before": looked["cached_tokens"],
            "pages_moved": pages_received(client, decode_url) - before, "seconds": round(seconds, 3),
            "text": answer.json()["choices"][0]["text"]}


def run_build(name: str, env: dict[str, str], args: argparse.Namespace) -> dict:
    model = ["--model", args.model] if args.model else []
    common = ["--threads", str(args.threads), "--kv-cache-memory", args.kv_cache_memory]
    processes = []
    try:
        prefill, prefill_url = start(["serve", *model, "--role", "prefill", *common], log_name=f"{name}-prefill", env=env)
        processes.append(prefill)
        decode, decode_url = start(["serve", *model, "--role", "decode", *common], log_name=f"{name}-decode", env=env)
        processes.append(decode)
        proxy, proxy_url = start(["proxy", "--prefill", prefill_url, "--decode", decode_url], log_name=f"{name}-proxy", env=env)
        processes.append(proxy)
        with httpx.Client(timeout=httpx.Timeout(600.0)) as client:
            model_id = client.get(f"{proxy_url}/v1/models").json()["data"][0]["id"]
            cases = []
            for index, length in enumerate(args.prompt_tokens):
                prompt = token_ids(client, prefill_url, 1000 + index, length, bos=True)
                other = prompt[:args.shared_tokens] + token_ids(client, prefill_url, 2000 + index,
                                                                length - args.shared_tokens, bos=False)
                first = send(client, proxy_url, decode_url, model_id, prompt, args.max_tokens)
                repeat = send(client, proxy_url, decode_url, model_id, prompt, args.max_tokens)
                shared = send(client, proxy_url, decode_url, model_id, other, args.max_tokens)
                cases.append({"prompt_tokens": length, "shared_tokens": args.shared_tokens, "first": first,
                              "repeat": repeat, "shared_prefix": shared,
                              "repeat_text_equals_first": repeat["text"] == first["text"]})
                print(f"{name} N={length}: pages moved first {first['pages_moved']:g}, repeat "
                      f"{repeat['pages_moved']:g} (lookup {repeat['cached_tokens_before']} cached), sharing "
                      f"{args.shared_tokens}: {shared['pages_moved']:g} (lookup {shared['cached_tokens_before']})",
                      flush=True)
        return {"cases": cases}
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def commit_of(path: Path) -> str:
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--prompt-tokens", type=lambda text: [int(n) for n in text.split(",")], default=[1000, 799],
                        help="prompt lengths, comma-separated")
    parser.add_argument("--shared-tokens", type=int, default=600, help="tokens the third prompt shares with the first")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kv-cache-memory", default="512MiB", help="each worker's")
    parser.add_argument("--baseline-src", type=Path, default=None, help="an older checkout, run in the same run")
    parser.add_argument("--baseline-commit", default=None,
                        help="the commit --baseline-src holds, where it is an export (git archive), not a checkout")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    builds = {"this": (here, {"PYTHONPATH": str(here / "src")})}
    if args.baseline_src is not None:
        src = (args.baseline_src / "src").resolve()
        if not (src / "ridgeline" / "__init__.py").is_file():
            raise SystemExit(f"--baseline-src: no ridgeline sources under {src}")
        builds["baseline"] = (args.baseline_src, {"PYTHONPATH": str(src)})
    commits = {"this": commit_of(here), "baseline": args.baseline_commit or commit_of(args.baseline_src or here)}
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "threads": args.threads,
              "kv_cache_memory": args.kv_cache_memory, "max_tokens": args.max_tokens}
    for name, (_, env) in builds.items():
        result[name] = {"commit": commits[name], **run_build(name, env, args)}
    result["commit"] = result["this"]["commit"]
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
