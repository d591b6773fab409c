"""How far 8-bit arithmetic moves Gemma's log-likelihoods when no BOS leads the context (issue 32, lm-eval remote).

    python benchmarks/lmeval_numerics.py [--bos]

lm-eval's remote tokenizer sends its (question, choice) pairs without a BOS, and there ridgeline and llama.cpp
differ by up to 1.86 nats (lmeval_remote.py). To tell whose arithmetic that is, this scores the same 80 pairs
offline (ridgeline's LLM with prompt logprobs, the task of benchmarks/lmeval/) three ways: as served (quantised
weights, 8-bit activations in the matmuls: int8 blocks or bf16, bf16 KV), with fp32 KV, and with the weights dequantised
to f32 at load (plain float matmuls: the arithmetic both engines approximate). Each is compared with the others
and with llama.cpp's scores saved by lmeval_remote.py --compare-llamacpp. `--bos` puts the BOS first on every
pair (not what lm-eval sends), the contrast. Writes results/lmeval_remote/numerics[_bos].json.
"""

import argparse
import json
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm import LLM
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.sampling_params import SamplingParams

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "lmeval_remote"
SETTINGS = (("quantized", "bf16"), ("quantized", "fp32"), ("f32", "fp32"))  # (weights, KV dtype); the first is served


@dataclass(frozen=True)
class DequantisedConfig(EngineConfig):
    """EngineConfig whose model loads with its weights dequantised (ModelOptions.weights), which serve has no
    option for."""

    weights: str = "quantized"

    def model_options(self):
        return replace(super().model_options(), weights=self.weights)


def pairs() -> list[tuple[str, str]]:
    """The task's (context, continuation) pairs as lm-eval builds them (doc_to_text, a space, the choice)."""
    docs = [json.loads(line) for line in (HERE / "lmeval" / "ridgeline_mc.jsonl").read_text().splitlines()]
    return [(f"Question: {d['question']}\nAnswer:", " " + choice) for d in docs for choice in d["choices"]]


def score(weights: str, kv: str, bos: bool) -> list[float]:
    llm = LLM(config=DequantisedConfig(kv_cache=KVCacheConfig(dtype=kv, memory_bytes=256 << 20), weights=weights))
    tokenizer, scores = llm.tokenizer, []
    first = [tokenizer.bos_id] if bos else []
    for context, continuation in pairs():
        head = tokenizer.encode(context, add_bos=False, special=True)
        tail = tokenizer.encode(context + continuation, add_bos=False, special=True)[len(head):]
        ids = first + head + tail
        out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0), use_tqdm=False)[0]
        # prompt_logprobs[i] is token i + 1's: the continuation's tokens start at len(first + head)
        scores.append(sum(out.prompt_logprobs[p - 1].logprob for p in range(len(first) + len(head), len(ids))))
    return scores


def gap(a: list[float], b: list[float]) -> dict:
    deltas = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return {"max_abs_delta_nats": max(deltas), "mean_abs_delta_nats": sum(deltas) / len(deltas)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bos", action="store_true", help="put the BOS before every pair")
    args = parser.parse_args()
    torch.set_num_threads(2)
    saved = json.loads((RESULTS / "lmeval_remote.json").read_text())
    llamacpp = (saved["summary"]["with_bos"]["llamacpp"] if args.bos
                else [x for row in saved["questions"] for x in row["llamacpp"]])
    scored = {f"{w}/{kv}": score(w, kv, args.bos) for w, kv in SETTINGS}
    exact = scored["f32/fp32"]
    result = {"benchmark": "lmeval_numerics", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "bos": args.bos, "pairs": len(exact), "machine": "AMD EPYC, AVX2 only, 2 shared cores",
              "llamacpp_vs_f32": gap(llamacpp, exact),
              "settings": {name: {"vs_llamacpp": gap(s, llamacpp), "vs_f32": gap(s, exact), "scores": s}
                           for name, s in scored.items()}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"numerics{'_bos' if args.bos else ''}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}
                     | {n: {k: v for k, v in s.items() if k != "scores"} for n, s in result["settings"].items()},
                     indent=1))


if __name__ == "__main__":
    main()
