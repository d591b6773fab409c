"""Regenerate the roofline guide's figures (docs/roofline.md) by running the `ridgeline roofline` commands.

    python scripts/make_ridge_plots.py [--measured RESULTS.json] [--remeasure]

Writes docs/images/roofline_default_this_machine.png (the bundled model on this machine, with llama.cpp's
measurements on this machine and any ridgeline results given by --measured) and
docs/images/roofline_llama31_8b_m4max.png (Llama-3.1-8B Q4_K_M on an Apple M4 Max).
"""

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# llama.cpp on the default model on this machine, 2 threads (midpoints of the ranges in
# shared/reference/README.md): llama-bench pp512 and tg128, and llama-batched-bench aggregate decode
# with 128-token prompts and 128 generated tokens (so about 192 tokens of context on average).
LLAMA_CPP_REFERENCE = [
    {"label": "llama.cpp pp512", "phase": "prefill", "prompt_tokens": 512, "tokens_per_s": 633},
    {"label": "llama.cpp tg128", "phase": "decode", "batch": 1, "context": 64, "tokens_per_s": 74},
    {"label": "llama.cpp x8", "phase": "decode", "batch": 8, "context": 192, "tokens_per_s": 157},
    {"label": "llama.cpp x32", "phase": "decode", "batch": 32, "context": 192, "tokens_per_s": 224},
]


def run(args: list[str]) -> None:
    print("$ " + shlex.join(["ridgeline", *args]), flush=True)
    ridgeline = Path(sys.executable).parent / "ridgeline"  # the entry point installed next to this Python
    subprocess.run([str(ridgeline), *args], check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, help="ridgeline results (roofline points JSON) to add to this machine's chart")
    parser.add_argument("--remeasure", action="store_true", help="measure this machine again instead of using the cache")
    options = parser.parse_args()

    points = list(LLAMA_CPP_REFERENCE)
    if options.measured:
        data = json.loads(options.measured.read_text())
        points += data["roofline_points"] if isinstance(data, dict) else data
    measured_file = ROOT / "benchmarks/results/make_ridge_plots/measured_this_machine.json"
    measured_file.parent.mkdir(parents=True, exist_ok=True)
    measured_file.write_text(json.dumps(points, indent=2) + "\n")

    this_machine = ["roofline", "--hardware", "this-machine", "--batch", "8", "--context", "192", "--prompt-tokens", "512",
                    "--measured", str(measured_file.relative_to(ROOT)), "--plot", "docs/images/roofline_default_this_machine.png"]
    run(this_machine + (["--remeasure"] if options.remeasure else []))
    run(["roofline", "--model", "llama-3.1-8b", "--weights", "Q4_K_M", "--hardware", "apple-m4-max", "--context", "4096",
         "--plot", "docs/images/roofline_llama31_8b_m4max.png"])


if __name__ == "__main__":
    main()
