#!/usr/bin/env python
"""Coverage-guided fuzzing (atheris) of the Hugging Face config path: config.json values of any type, missing
or out of range, beside a small real safetensors file -> load_hf_dir.

    python tests/fuzz/fuzz_hf_config.py [-runs=N | -max_total_time=S] [-seed=N]
    python tests/fuzz/fuzz_hf_config.py --show CRASH_FILE    # print the config.json it stands for

Structure-aware: each input picks a valid seed config and rewrites, drops or adds a few known keys with
values of any JSON type (huge, negative, NaN, strings, nested lists...). Every input must load or end in a
one-line ModelLoadError; anything else is a crash (libFuzzer writes the input under the work directory).
"""

import copy
import json
import sys
import tempfile
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

with atheris.instrument_imports(include=["ridgeline"]):
    from ridgeline.errors import ModelLoadError
    from ridgeline.model.hf_loader import load_hf_dir

from seeds import seed_hf_configs, write_seed_safetensors  # noqa: E402

SEEDS = seed_hf_configs()
KEYS = sorted({key for seed in SEEDS for key in (seed.get("text_config") or seed)} | {
    "model_type", "text_config", "head_dim", "tie_word_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
    "layer_types", "sliding_window_pattern", "sliding_window", "rope_local_base_freq", "query_pre_attn_scalar",
    "use_sliding_window", "attention_bias", "factor", "rope_type", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings", "full_attention", "sliding_attention",
})
SPECIAL_FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324]
WORK = Path(tempfile.mkdtemp(prefix="ridgeline-fuzz-hf-"))


def any_value(data: atheris.FuzzedDataProvider, depth: int = 0):
    kind = data.ConsumeIntInRange(0, 9)
    if kind == 0:
        return data.ConsumeInt(9)  # up to 2**71 either side
    if kind == 1:
        return data.ConsumeIntInRange(-2, 9)
    if kind == 2:
        return data.ConsumeRegularFloat()
    if kind == 3:
        return data.PickValueInList(SPECIAL_FLOATS)
    if kind == 4:
        return data.ConsumeUnicodeNoSurrogates(12) if data.ConsumeBool() else data.PickValueInList(KEYS)
    if kind == 5:
        return data.ConsumeBool()
    if kind == 6:
        return None
    if kind == 7 and depth < 2:
        return [any_value(data, depth + 1) for _ in range(data.ConsumeIntInRange(0, 4))]
    if kind == 8 and depth < 2:
        return {data.PickValueInList(KEYS): any_value(data, depth + 1) for _ in range(data.ConsumeIntInRange(0, 3))}
    return data.PickValueInList(["llama", "qwen2", "mistral", "gemma3", "gemma3_text", "llama3", "linear", "default"])


def mutated_config(data: atheris.FuzzedDataProvider) -> dict:
    config = copy.deepcopy(SEEDS[data.ConsumeIntInRange(0, len(SEEDS) - 1)])
    for _ in range(data.ConsumeIntInRange(0, 6)):
        target = config
        if isinstance(config.get("text_config"), dict) and data.ConsumeBool():
            target = config["text_config"]
        for nested in ("rope_scaling", "rope_parameters"):
            if isinstance(target.get(nested), dict) and data.ConsumeBool():
                target = target[nested]
        key = data.PickValueInList(KEYS)
        if data.ConsumeIntInRange(0, 3) == 0:
            target.pop(key, None)
        else:
            target[key] = any_value(data)
    return config


def test_one_input(data: bytes) -> None:
    config = mutated_config(atheris.FuzzedDataProvider(data))
    (WORK / "config.json").write_text(json.dumps(config))  # NaN/Infinity as Python writes them, as HF does
    try:
        load_hf_dir(WORK)
    except ModelLoadError as error:
        if "\n" in str(error):
            raise AssertionError(f"ModelLoadError spans lines: {error!r}") from None


def main(argv: list[str]) -> None:
    write_seed_safetensors(WORK / "model.safetensors", SEEDS[0])
    options = [a for a in argv[1:] if a.startswith("-")]
    corpus = WORK / "corpus"
    corpus.mkdir()
    defaults = ["-timeout=20", "-rss_limit_mb=4096", f"-artifact_prefix={WORK}/", "-print_final_stats=1"]
    print(f"fuzz_hf_config: work directory {WORK}", file=sys.stderr)
    atheris.Setup([argv[0], *defaults, *options, str(corpus)], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--show"]:  # the config.json a kept input stands for (for tests/data/fuzz/hf_config/)
        print(json.dumps(mutated_config(atheris.FuzzedDataProvider(Path(sys.argv[2]).read_bytes()))))
    else:
        main(sys.argv)
