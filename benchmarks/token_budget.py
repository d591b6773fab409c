"""The token budget per step: an ITL target against fixed budgets, on a burst through `ridgeline serve`.

    flock /tmp/ridgeline-cpu.lock .venv/bin/python benchmarks/token_budget.py [--threads 2] [--budgets 2048,512,128]
        [--json benchmarks/results/token_budget/RUN.json]

The load is issue 16's burst: --num-prompts requests of --input-len words (about a token each) and --output-len
output tokens, all sent at once (concurrency = --num-prompts), as `ridgeline bench serve` sends them (its library
does the sending and the figures). Each setting gets a fresh server (benchmarks/served.py) and two short warm-up
requests before the burst:
  itl-target:  --itl-target-ms auto (the default: a step with decodes may take 2x what a decode-only step of the
               running and waiting requests takes, measured as the engine runs), --max-num-batched-tokens 2048
               for steps without decodes;
  fixed-B:     --itl-target-ms 0 --max-num-batched-tokens B (every step fills B tokens, as before issue 16).
Reported per setting: output tok/s, TTFT p50/p99, ITL p50/p99 and p99/p50, and from the server's /v1/steps what
the budget did (steps, mixed steps, the largest prefill beside decodes, the median prefill limit and ITL target).
The settings run in turn --repeats times (round-robin, so a neighbour's load on a shared machine falls on all
of them alike); the table gives each figure's median over the repeats, the JSON every run.
Targets (issue 16): with the ITL target, p99 ITL <= 3x its median and output tok/s no lower than "today's", the
server's when the issue was filed. That server runs beside the others with --baseline-src (a checkout of that commit,
e.g. `git worktree add /tmp/rl/before-16 74b13ab`, its own --baseline-cache so its kernels build apart): setting
`baseline`, its own defaults (a fixed budget of 2,048) and no step log. fixed-2048 is this build's own old policy.
"""

import argparse
import datetime
import json
import statistics
import subprocess
from pathlib import Path

import httpx
from ridgeline.bench.served import ridgeline_server

from ridgeline.bench.bench_serve import BenchServeConfig, LoadLevel, bench_serve

TARGET_P99_OVER_P50 = 3.0
FULL_BUDGET = 2048


def settings(budgets: list[int]) -> list[tuple[str, list[str]]]:
    return [("itl-target", ["--itl-target-ms", "auto", "--max-num-batched-tokens", str(FULL_BUDGET)])] + [
        (f"fixed-{budget}", ["--itl-target-ms", "0", "--max-num-batched-tokens", str(budget)]) for budget in budgets]


def budget_summary(steps: list[dict]) -> dict:
    """What the steps of the burst were and what the ITL target allowed beside decodes."""
    limited = [s for s in steps if s.get("prefill_limit") is not None]
    targets = [s["itl_target_s"] * 1e3 for s in limited if s.get("itl_target_s") is not None]
    return {
        "steps": len(steps),
        "mixed_steps": sum(s["kind"] == "mixed" for s in steps),
        "max_prefill_tokens_beside_decodes": max((s["prefill_tokens"] for s in steps if s["kind"] == "mixed"),
                                                 default=0),
        "limited_steps": len(limited),
        "median_prefill_limit": statistics.median(s["prefill_limit"] for s in limited) if limited else None,
        "median_itl_target_ms": statistics.median(targets) if targets else None,
    }


def median_run(runs: list[dict]) -> dict:
    """Each figure's median over the runs of one setting."""
    figures = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "itl_p99_over_p50")
    budget = ("mixed_steps", "max_prefill_tokens_beside_decodes")
    return ({key: statistics.median(r[key] for r in runs) for key in figures}
            | {"budget": {key: statistics.median(r["budget"][key] for r in runs) for key in budget}
                         if runs[0]["budget"] is not None else None}
            | {"failed": sum(r["failed"] for r in runs)})


def baseline_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment that makes `ridgeline serve` the older checkout's: its sources first on the path, and a
    cache of its own (its compiled kernels differ from this build's)."""
    src = (args.baseline_src / "src").resolve()
    if not (src / "ridgeline" / "__init__.py").is_file():
        raise SystemExit(f"--baseline-src: no ridgeline sources under {src}")
    return {"PYTHONPATH": str(src), "RIDGELINE_CACHE_DIR": str(args.baseline_cache.resolve())}


def run_setting(serve_args: list[str], args: argparse.Namespace, env: dict[str, str] | None = None) -> dict:
    common = ["--threads", str(args.threads), "--kv-cache-memory", args.kv_cache_memory]
    with ridgeline_server(*common, *serve_args, env=env) as (url, _):
        warm = BenchServeConfig(url, num_prompts=2, input_len=32, output_len=8)
        bench_serve(warm, [LoadLevel(concurrency=2)])
        recorded = httpx.get(f"{url}/v1/steps", params={"limit": 1}, timeout=30)
        step_log = recorded.status_code == 200  # an older build (a --baseline-src) may have no /v1/steps
        if step_log:
            after = recorded.json()["recorded"] - 1
        config = BenchServeConfig(url, num_prompts=args.num_prompts, input_len=args.input_len,
                                  output_len=args.output_len, max_seconds=args.max_seconds)
        level = bench_serve(config, [LoadLevel(concurrency=args.num_prompts)])["levels"][0]
        steps = httpx.get(f"{url}/v1/steps", params={"after": after}, timeout=30).json()["data"] if step_log else None
    itl, ttft = level["itl_ms"], level["ttft_ms"]
    return {
        "completed": level["completed"], "failed": level["failed"], "errors": level["errors"],
        "duration_s": level["duration_s"], "output_tokens": level["output_tokens"],
        "prompt_tokens": level["prompt_tokens"], "output_tokens_per_s": level["output_tokens_per_s"],
        "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"], "itl_p50_ms": itl["p50"], "itl_p99_ms": itl["p99"],
        "itl_p99_over_p50": itl["p99"] / itl["p50"] if itl["p50"] else None,
        "budget": budget_summary(steps) if steps is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budgets", default="2048,512,128", help="fixed max_num_batched_tokens to compare")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--kv-cache-memory", default="2GiB")
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting (round-robin)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="a checkout of an older ridgeline to serve beside, with its defaults (setting `baseline`)")
    parser.add_argument("--baseline-cache", type=Path, default=Path("/tmp/ridgeline-baseline-cache"),
                        help="RIDGELINE_CACHE_DIR for the baseline (its kernels are built there on first use)")
    args = parser.parse_args()
    env = baseline_env(args) if args.baseline_src else None

    runs: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for name, serve_args in settings([int(b) for b in args.budgets.split(",")]) + ([("baseline", [])] if env else []):
            r = run_setting(serve_args, args, env if name == "baseline" else None) | {"serve_args": serve_args}
            runs.setdefault(name, []).append(r)
            print(f"run {repeat + 1} {name}: {r['output_tokens_per_s']:.0f} output tok/s, ITL p99/p50 "
                  f"{r['itl_p99_over_p50']:.2f}", flush=True)
    results = {name: median_run(rs) for name, rs in runs.items()}
    reference = results.get(f"fixed-{FULL_BUDGET}")
    verdict = None
    if "itl-target" in results and reference is not None:
        ours = results["itl-target"]
        verdict = {"p99_over_p50_within_3x": ours["itl_p99_over_p50"] <= TARGET_P99_OVER_P50,
                   "output_tok_s_at_least_fixed_2048": ours["output_tokens_per_s"] >= reference["output_tokens_per_s"]}
        if "baseline" in results:
            verdict["output_tok_s_at_least_baseline"] = (ours["output_tokens_per_s"]
                                                         >= results["baseline"]["output_tokens_per_s"])
    print(f"\n{args.num_prompts} requests x ({args.input_len} prompt words / {args.output_len} output tokens) at once, "
          f"--threads {args.threads}; median of {args.repeats} runs each")
    print(f"{'setting':12} {'out tok/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'p99/p50':>8}"
          f" {'mixed steps':>11} {'max prefill beside decodes':>27}")
    for name, r in results.items():
        b = r["budget"]
        steps = f"{b['mixed_steps']:11.0f} {b['max_prefill_tokens_beside_decodes']:27.0f}" if b else f"{'-':>11} {'-':>27}"
        print(f"{name:12} {r['output_tokens_per_s']:9.1f} {r['ttft_p50_ms'] / 1e3:8.2f}s {r['ttft_p99_ms'] / 1e3:8.2f}s "
              f"{r['itl_p50_ms']:6.0f}ms {r['itl_p99_ms']:6.0f}ms {r['itl_p99_over_p50']:7.2f}x {steps}")
    if verdict is not None:
        print(f"targets: p99 ITL <= {TARGET_P99_OVER_P50:.0f}x p50: {'met' if verdict['p99_over_p50_within_3x'] else 'missed'};"
              f" output tok/s >= fixed-{FULL_BUDGET}: {'met' if verdict['output_tok_s_at_least_fixed_2048'] else 'missed'}"
              + (f"; >= baseline (today's, as filed): {'met' if verdict['output_tok_s_at_least_baseline'] else 'missed'}"
                 if "output_tok_s_at_least_baseline" in verdict else ""))
    if args.json:
        load = {key: getattr(args, key) for key in ("threads", "num_prompts", "input_len", "output_len", "kv_cache_memory")}
        if env:
            load["baseline_commit"] = subprocess.run(["git", "-C", str(args.baseline_src), "rev-parse", "HEAD"],
                                                     capture_output=True, text=True).stdout.strip() or None
        args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "load": load | {"repeats": args.repeats},
                                         "median": results, "verdict": verdict, "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
