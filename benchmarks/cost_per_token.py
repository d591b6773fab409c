"""Dollars per million tokens for the seeds' cases: H100 vs H200 vs M2 Ultra vs DGX Spark, on Llama-3.1-8B (BF16
and Q4_K_M) and gpt-oss-120b (MXFP4), for a chat-shaped and a RAG-shaped workload, each at its SLO.

Two estimates per case, both from the commands themselves (run in process, their --json output read back):
  - `ridgeline advise --slo-...`: the napkin model, each machine at the most concurrent requests that keep the
    SLO (prefill and decode at 50 % of their roofline ceilings);
  - `ridgeline simulate --search --slo-...`: ridgeline's own scheduler on the machine's roofline step time,
    Poisson arrivals at the highest rate where 90 % of requests meet the SLO, priced over that run (idle time
    included).
Prices are the catalogue's (src/ridgeline/napkin/hardware_catalogue.toml; docs/cost.md). No machine is measured:
this is napkin maths, seconds of CPU per case.

    python benchmarks/cost_per_token.py [--num-prompts 100] [--out benchmarks/results/cost_per_token]
        [--plot docs/images/cost_per_token.png] [--no-simulate]
"""

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from typer.testing import CliRunner

from ridgeline.cli import register_commands
from ridgeline.cli.app import app
from ridgeline.napkin.hardware import catalogued
from ridgeline.napkin.plot import plot_cost_per_token

ROOT = Path(__file__).resolve().parents[1]
MACHINES = ("nvidia-h100-sxm", "nvidia-h200", "apple-m2-ultra", "nvidia-dgx-spark")
MODELS = (("llama-3.1-8b", "BF16"), ("llama-3.1-8b", "Q4_K_M"), ("gpt-oss-120b", "MXFP4"))
# Chat: a short prompt and a longer answer, read as it streams. RAG: retrieved passages make a long prompt, the
# answer is short, and the reader waits longer for its first token.
WORKLOADS = {
    "chat": {"prompt_tokens": 512, "output_tokens": 256, "slo_ttft_ms": 1000, "slo_itl_ms": 50},
    "rag": {"prompt_tokens": 4096, "output_tokens": 256, "slo_ttft_ms": 2000, "slo_itl_ms": 50},
}


def run(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise RuntimeError(f"ridgeline {' '.join(args)} failed: {result.output}{result.exception!r}")
    return json.loads(result.stdout)


def advise_case(model: str, weights: str, shape: dict) -> dict[str, dict]:
    report = run(["advise", "--model", model, "--weights", weights, "--prompt-tokens", str(shape["prompt_tokens"]),
                  "--output-tokens", str(shape["output_tokens"]), "--slo-ttft-ms", str(shape["slo_ttft_ms"]),
                  "--slo-itl-ms", str(shape["slo_itl_ms"]), "--json"])
    return {row["hardware"]: row for row in report["ranking"]}


def simulate_case(model: str, weights: str, machine: str, shape: dict, num_prompts: int) -> dict:
    try:
        report = run(["simulate", "--model", model, "--weights", weights, "--hardware", machine, "--search",
                      "--num-prompts", str(num_prompts), "--input-len", str(shape["prompt_tokens"]),
                      "--output-len", str(shape["output_tokens"]), "--slo-ttft-ms", str(shape["slo_ttft_ms"]),
                      "--slo-itl-ms", str(shape["slo_itl_ms"]), "--json"])
    except RuntimeError as error:  # the weights do not fit the machine
        return {"error": str(error).splitlines()[-1][:300]}
    found = report["search"]
    return {"max_rate": found["max_rate"], "cost": found.get("cost_at_max_rate")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=100, help="Requests per simulated load level.")
    parser.add_argument("--no-simulate", action="store_true",
                        help="advise only (seconds): skip the simulator's searches (minutes of CPU in all).")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/cost_per_token"))
    parser.add_argument("--plot", default=str(ROOT / "docs/images/cost_per_token.png"))
    args = parser.parse_args()
    register_commands()
    started = time.perf_counter()
    rows = []
    for model, weights in MODELS:
        for workload, shape in WORKLOADS.items():
            advised = advise_case(model, weights, shape)
            for machine in MACHINES:
                a = advised[machine]
                if args.no_simulate:
                    sim = {"max_rate": None, "cost": None, "skipped": "--no-simulate"}
                elif not a["fits"]:
                    sim = {"error": a["why_not"]}
                elif not a["meets_slo"]:  # misses it alone (batch 1): queueing only adds to that, so skip the search
                    sim = {"max_rate": 0.0, "cost": None, "skipped": "advise: misses the SLO with one request"}
                else:
                    sim = simulate_case(model, weights, machine, shape, args.num_prompts)
                rows.append({"model": model, "weights": weights, "workload": workload, "hardware": machine,
                             "usd_per_hour": catalogued(machine).price.usd_per_hour,
                             "advise": {"fits": a["fits"], "why_not": a["why_not"], "meets_slo": a["meets_slo"],
                                        "concurrency": a["concurrency"], "cost": a["cost"]},
                             "simulate": sim})
                print(f"{model} {weights} {workload} {machine}: advise "
                      f"{fmt(a['cost'] and a['fits'] and a['meets_slo'] and a['cost']['blended_usd_per_mtok'])}, "
                      f"simulate {fmt((sim.get('cost') or {}).get('blended_usd_per_mtok'))} $/Mtok blended",
                      file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    result = {
        "benchmark": "cost_per_token",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "machines": {m: {"usd_per_hour": catalogued(m).price.usd_per_hour, "kind": catalogued(m).price.kind,
                         "source": catalogued(m).price.source} for m in MACHINES},
        "workloads": WORKLOADS,
        "num_prompts": args.num_prompts,
        "simulated": not args.no_simulate,
        "rows": rows,
        "wall_s": time.perf_counter() - started,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_per_token.json").write_text(json.dumps(result, indent=2) + "\n")
    source = "advise" if args.no_simulate else "simulate --search"
    plot_cost_per_token([row_for_plot(r, source) for r in rows], args.plot,
                        f"$ per million tokens (blended) at the SLO: {source}, catalogue prices")
    print(table(rows))
    print(f"wrote {out / 'cost_per_token.json'} and {args.plot} in {result['wall_s']:.0f} s", file=sys.stderr)


def row_for_plot(row: dict, source: str) -> dict:
    if source == "advise":
        a = row["advise"]
        cost = a["cost"] if a["fits"] and a["meets_slo"] else {}
    else:
        cost = (row["simulate"].get("cost") or {}) if row["simulate"].get("max_rate") else {}
    return {"case": f"{row['model']} {row['weights']}, {row['workload']}", "hardware": row["hardware"],
            "usd_per_mtok": cost.get("blended_usd_per_mtok")}


def fmt(value) -> str:
    if not value:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:,.1f}"


def table(rows: list[dict]) -> str:
    """The docs' table: $/Mtok prompt / completion / blended from advise and simulate per case."""
    lines = ["| model | workload | machine | $/h | advise: batch | advise $/Mtok in / out / all | simulate: req/s "
             "| simulate $/Mtok in / out / all |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, s = r["advise"], r["simulate"]
        if not a["fits"]:
            advised = "does not fit"
        elif not a["meets_slo"]:
            advised = "misses SLO"
        else:
            c = a["cost"]
            advised = " / ".join(fmt(c[k]) for k in ("prompt_usd_per_mtok", "completion_usd_per_mtok", "blended_usd_per_mtok"))
        if s.get("skipped") == "--no-simulate":
            simulated, rate = "not run", "-"
        elif "error" in s:
            simulated, rate = "does not fit", "-"
        elif not s["max_rate"]:
            simulated, rate = "misses SLO", "0"
        else:
            c = s["cost"]
            simulated = " / ".join(fmt(c[k]) for k in ("prompt_usd_per_mtok", "completion_usd_per_mtok", "blended_usd_per_mtok"))
            rate = f"{s['max_rate']:.3g}"
        batch = str(a["concurrency"]) if a["fits"] and a["meets_slo"] else "-"
        lines.append(f"| {r['model']} {r['weights']} | {r['workload']} | {r['hardware']} | {r['usd_per_hour']:.3f} "
                     f"| {batch} | {advised} | {rate} | {simulated} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
