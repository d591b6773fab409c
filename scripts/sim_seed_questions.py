"""Answer the seeds' five serving questions with `ridgeline simulate`'s engine (roofline step time, catalogue
machines) and write the simulator guide's figures and numbers (docs/simulator.md).

    python scripts/sim_seed_questions.py [--requests N] [--only q5_macs ...]

Writes docs/images/sim_q1_decode_knee.png ... docs/images/sim_q5_macs.png and benchmarks/results/sim_seed_questions/sim_seed_answers.json (--only redraws the
named questions and keeps the other answers already in the JSON).
"""

import argparse
import dataclasses
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ridgeline.engine.scheduler import SchedulerConfig  # noqa: E402
from ridgeline.errors import RidgelineError  # noqa: E402
from ridgeline.napkin.hardware import catalogued  # noqa: E402
from ridgeline.napkin.model_specs import MODEL_SPECS  # noqa: E402
from ridgeline.napkin.roofline import Roofline  # noqa: E402
from ridgeline.workload.serve_metrics import Slo  # noqa: E402
from ridgeline.sim.kv_pool import kv_pool  # noqa: E402
from ridgeline.sim.metrics import summarise_run  # noqa: E402
from ridgeline.sim.setup import SimOptions, deployment  # noqa: E402
from ridgeline.sim.simulator import simulate  # noqa: E402
from ridgeline.sim.workload import synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
ANSWERS = ROOT / "benchmarks" / "results" / "sim_seed_questions" / "sim_seed_answers.json"
H100 = "nvidia-h100-sxm"


def finish(fig, ax, name: str, grid: str = "major") -> None:
    ax.legend(fontsize=8)
    ax.grid(True, which=grid, alpha=0.3)
    fig.tight_layout()
    fig.savefig(IMAGES / name, dpi=120)


def run(deploy, workload, slo=Slo()) -> dict:
    return summarise_run(simulate(deploy, workload), slo, {}, deploy.shape.name)


def q1_decode_knee(n: int) -> dict:
    """Aggregate decode tok/s of Llama-3.1-8B BF16 on an H100 against the running batch."""
    options = SimOptions("llama-3.1-8b", "BF16", H100, scheduler=SchedulerConfig(max_num_batched_tokens=16384,
                                                                                   max_num_seqs=2048))
    deploy = deployment(options)
    roofline = Roofline(deploy.shape, catalogued(H100))
    rows = []
    for batch in (1, 4, 16, 64, 128, 256, 384, 512, 768, 1024):
        # Short prompts and long outputs: the steady state is decode at the batch; one round of requests.
        level = run(deploy, synthetic(batch, 32, 256, deploy.shape.vocab_size, concurrency=batch, seed=1))
        tpot = level["tpot_ms"]["p50"] / 1e3
        rows.append({"batch": batch, "decode_tokens_per_s": batch / tpot, "tpot_ms": tpot * 1e3})
    knee = roofline.compute_bound_batch(context=160)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([r["batch"] for r in rows], [r["decode_tokens_per_s"] for r in rows], "o-", label="simulated (roofline step time)")
    ax.axvline(knee, color="grey", ls="--", label=f"napkin: compute-bound from batch {knee} (ridge {roofline.ridge:.0f} FLOP/B)")
    ax.set(xscale="log", yscale="log", xlabel="running batch (sequences decoding together)", ylabel="aggregate decode tok/s",
           title="Llama-3.1-8B BF16 on an H100 SXM: decode throughput vs batch")
    finish(fig, ax, "sim_q1_decode_knee.png", "both")
    return {"ridge_flop_per_byte": roofline.ridge, "compute_bound_from_batch": knee, "points": rows}


def q2_chunk_budget(n: int) -> dict:
    """ITL vs TTFT under a mixed workload (long prompts arriving into running decodes) at budgets 2048 and 8192."""
    result = {}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for budget in (2048, 8192):
        deploy = deployment(SimOptions("llama-3.1-8b", "BF16", H100, scheduler=SchedulerConfig(max_num_batched_tokens=budget)))
        rows = []
        for rate in (1, 2, 3, 4):
            level = run(deploy, synthetic(n, 6000, 256, deploy.shape.vocab_size, rate=rate, seed=2))
            rows.append({"rate": rate, "ttft_p50_ms": level["ttft_ms"]["p50"], "ttft_p90_ms": level["ttft_ms"]["p90"],
                         "itl_p50_ms": level["itl_ms"]["p50"], "itl_p99_ms": level["itl_ms"]["p99"]})
        result[budget] = rows
        ax.plot([r["ttft_p50_ms"] for r in rows], [r["itl_p99_ms"] for r in rows], "o-", label=f"max_num_batched_tokens {budget}")
        for r in rows:
            ax.annotate(f"{r['rate']}/s", (r["ttft_p50_ms"], r["itl_p99_ms"]), fontsize=7)
    ax.set(xlabel="TTFT p50 (ms)", ylabel="ITL p99 (ms)", xscale="log",
           title="Chunk budget: Llama-3.1-8B on an H100, 6,000-token prompts, 256 output tokens")
    finish(fig, ax, "sim_q2_chunk_budget.png")
    return result


def q3_kv_capacity(n: int) -> dict:
    """Llama-3.3-70B (Q4_K_M weights, 43 GB) on one 80 GB H100 at 8k context: how far the KV pool lets the batch go."""
    base = deployment(SimOptions("llama-3.3-70b", "Q4_K_M", H100, scheduler=SchedulerConfig(max_num_batched_tokens=8192)))
    variants = {"GQA (8 KV heads), FP16 KV": (base.shape, 2), "GQA, 8-bit KV": (base.shape, 1),
                "full MHA (64 KV heads), FP16 KV": (dataclasses.replace(base.shape, num_kv_heads=base.shape.num_heads), 2)}
    result = {}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (shape, kv_bytes) in variants.items():
        pool = kv_pool(shape, base.pool.memory_bytes, 16, kv_bytes)
        deploy = dataclasses.replace(base, shape=shape, pool=pool, kv_dtype_bytes=kv_bytes)
        rows = []
        for concurrency in (1, 8, 16, 32, 64):
            level = run(deploy, synthetic(max(concurrency, 8), 7936, 256, shape.vocab_size, concurrency=concurrency, seed=3))
            rows.append({"concurrency": concurrency, "running_batch_mean": level["engine"]["running_batch_mean"],
                         "output_tokens_per_s": level["output_tokens_per_s"], "preemptions": level["engine"]["preemptions"],
                         "ttft_p50_ms": level["ttft_ms"]["p50"]})
        result[label] = {"kv_pool_gb": pool.memory_bytes / 1e9, "kv_tokens": pool.tokens_of_all_layers,
                         "sequences_of_8k": pool.tokens_of_all_layers // 8192, "points": rows}
        ax.plot([r["concurrency"] for r in rows], [r["output_tokens_per_s"] for r in rows], "o-",
                label=f"{label}: {pool.tokens_of_all_layers // 8192} x 8k fit")
    ax.set(xscale="log", xlabel="clients (8k-token conversations in flight)", ylabel="output tok/s",
           title="Llama-3.3-70B Q4_K_M on one H100 80 GB (29 GB left for KV)")
    finish(fig, ax, "sim_q3_kv_capacity.png", "both")
    result["kv_gb_for_32_x_8k_fp16"] = 32 * base.shape.kv_bytes_for_context(8192, 2) / 1e9
    return result


def q4_disaggregation(n: int) -> dict:
    """Goodput of four H100s, colocated vs prefill/decode pools (DistServe-style), under TTFT and ITL SLOs."""
    slo = Slo(ttft_ms=600, itl_ms=30)
    layouts = {"4 colocated": dict(replicas=4), "1:3 disaggregated": dict(disaggregate=(1, 3)),
               "2:2 disaggregated": dict(disaggregate=(2, 2))}
    result = {}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, layout in layouts.items():
        deploy = deployment(SimOptions("llama-3.1-8b", "BF16", H100, **layout))
        rows = []
        for rate in (10, 20, 30, 40, 50):
            level = run(deploy, synthetic(n, 3000, 256, deploy.shape.vocab_size, rate=rate, seed=4), slo)
            rows.append({"rate": rate, "goodput": level["goodput"], "ttft_p90_ms": level["ttft_ms"]["p90"],
                         "tpot_p90_ms": level["tpot_ms"]["p90"]})
        result[label] = rows
        ax.plot([r["rate"] for r in rows], [r["goodput"] for r in rows], "o-", label=label)
    ax.set(xlabel="offered load (requests/s)", ylabel="goodput (requests/s within TTFT 600 ms, TPOT 30 ms)",
           title="Four H100s, Llama-3.1-8B, 3,000-token prompts: colocated vs disaggregated")
    finish(fig, ax, "sim_q4_disaggregation.png")
    return result


MACS = {"apple-m4-mini-16gb": "Mac mini M4, 16 GB (120 GB/s)", "apple-m4-pro-48gb": "M4 Pro, 48 GB (273 GB/s)"}
Q5_PROMPT, Q5_OUTPUT = 512, 128


def q5_macs(n: int) -> dict:
    """The seed's Mac mini M4 16 GB vs M4 Pro 48 GB: which catalogue models fit (weights within 90 % of memory and
    room for one sequence's KV beside them), and the tokens/s one conversation gets: decode (memory-bound, so
    bandwidth) and prompt processing (compute-bound, so the GPU's FLOP/s)."""
    series: dict[str, dict] = {}
    labels: list[str] = []
    for machine in MACS:
        series[machine] = {}
        for name, spec in MODEL_SPECS.items():
            for weights in ("Q4_K_M", "Q8_0", "BF16") if not spec.num_experts else ("MXFP4",):
                key = f"{name} {weights}"
                if key not in labels:
                    labels.append(key)
                try:
                    deploy = deployment(SimOptions(name, weights, machine))
                except RidgelineError:
                    series[machine][key] = None  # the weights do not fit
                    continue
                level = run(deploy, synthetic(4, Q5_PROMPT, Q5_OUTPUT, deploy.shape.vocab_size, concurrency=1, seed=5))
                if not level["completed"]:  # loaded, but not even one 640-token sequence fits beside the weights
                    series[machine][key] = None
                    continue
                series[machine][key] = {"weights_gb": deploy.shape.total_weight_bytes / 1e9,
                                        "decode_tokens_per_s": 1e3 / level["tpot_ms"]["p50"],
                                        "prompt_tokens_per_s": Q5_PROMPT / (level["ttft_ms"]["p50"] / 1e3),
                                        "ttft_ms": level["ttft_ms"]["p50"]}
    labels = [k for k in labels if any(series[m][k] for m in MACS)] + \
             [k for k in labels if not any(series[m][k] for m in MACS)]  # what fits somewhere first
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.5), sharey=True)
    width = 0.4
    for ax, figure, title in ((axes[0], "decode_tokens_per_s", "decode tok/s, one stream"),
                              (axes[1], "prompt_tokens_per_s", f"prompt tok/s ({Q5_PROMPT}-token prompt)")):
        for i, (machine, machine_label) in enumerate(MACS.items()):
            rows = [j + i * width for j in range(len(labels))]
            values = [(series[machine][k] or {}).get(figure, 0) for k in labels]
            bars = ax.barh(rows, values, width, label=machine_label)
            for row, value, bar in zip(rows, values, bars):
                if value:
                    ax.annotate(f"{value:.0f}", (value, row), xytext=(3, 0), textcoords="offset points", va="center",
                                fontsize=6, color=bar.get_facecolor())
                else:  # no bar on a log axis: say so at its left edge
                    ax.annotate("does not fit", (0.01, row), xycoords=("axes fraction", "data"), va="center",
                                fontsize=6, color="grey")
        ax.set(xscale="log", title=title)  # 270M and 32B models on one axis
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks([j + width / 2 for j in range(len(labels))], labels, fontsize=7)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("The seed's 16 GB Mac mini M4 vs 48 GB M4 Pro: what fits, and at what speed "
                 "(simulated, roofline step time)", fontsize=10)
    fig.tight_layout()
    fig.savefig(IMAGES / "sim_q5_macs.png", dpi=120)
    return series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    questions = {q.__name__: q for q in (q1_decode_knee, q2_chunk_budget, q3_kv_capacity, q4_disaggregation, q5_macs)}
    parser.add_argument("--requests", type=int, default=400, help="requests per simulated load level")
    parser.add_argument("--only", nargs="+", choices=list(questions), default=list(questions), help="questions to answer")
    options = parser.parse_args()
    answers = json.loads(ANSWERS.read_text()) if ANSWERS.exists() and options.only != list(questions) else {}
    IMAGES.mkdir(parents=True, exist_ok=True)
    ANSWERS.parent.mkdir(parents=True, exist_ok=True)
    for question in (questions[name] for name in options.only):
        print(question.__name__, flush=True)
        answers[question.__name__] = question(options.requests)
        ANSWERS.write_text(json.dumps(answers, indent=2))  # kept as each one lands
    ANSWERS.write_text(json.dumps(answers, indent=2))


if __name__ == "__main__":
    main()
