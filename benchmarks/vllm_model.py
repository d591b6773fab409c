"""The default GGUF (Gemma 3 270M Q4_K_M) as a Hugging Face directory with bf16 weights, for vLLM.

    python benchmarks/vllm_model.py [--model PATH]     # builds benchmarks/.venv-vllm if needed; prints the directory

vLLM serves Hugging Face checkpoints; its GGUF path is a plugin (the `extra-quant` extra) with other kernels, while
the issue compares against vLLM as a user runs it: bf16 weights. transformers reads the GGUF (dequantising every
tensor, and undoing llama.cpp's Gemma conventions such as the +1 folded into the norm weights) and writes config,
tokenizer and safetensors. The conversion runs in vLLM's environment, so that the transformers which writes the
config is the one vLLM reads it with; it adds the two small packages transformers' GGUF reader needs there
(CONVERSION_EXTRAS). The result is cached under benchmarks/.vllm-model/ (ignored), keyed by the GGUF's name and
size, and reused while the stamp file, written last, matches.
"""

import argparse
import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE_DIR = HERE / ".vllm-model"
CPU_LOCK = Path("/tmp/ridgeline-cpu.lock")
STAMP = "ridgeline-source.json"
CONVERSION_FORMAT = 2  # bump when the conversion changes, so cached directories are redone (2: the BOS token)
CONVERSION_EXTRAS = ("gguf==0.19.0", "accelerate==1.15.0")  # transformers refuses gguf_file= without accelerate


def converted_dir(gguf: Path, cache_dir: Path = CACHE_DIR) -> Path:
    return cache_dir / f"{gguf.stem}-bf16"


def source_stamp(gguf: Path) -> dict:
    return {"gguf": gguf.name, "bytes": gguf.stat().st_size, "dtype": "bfloat16", "format": CONVERSION_FORMAT}


def is_converted(out: Path, gguf: Path) -> bool:
    stamp = out / STAMP
    return stamp.exists() and json.loads(stamp.read_text()) == source_stamp(gguf)


def converted_model(gguf: Path, python: Path, out: Path | None = None) -> Path:
    """`gguf` as a bf16 Hugging Face directory, converting it with `python` (vLLM's interpreter) unless cached."""
    if out is None:
        CACHE_DIR.mkdir(exist_ok=True)
        (CACHE_DIR / ".gitignore").write_text("*\n")  # ignored without an entry in the shared root .gitignore
        out = converted_dir(gguf)
    if is_converted(out, gguf):
        return out
    if subprocess.run([python, "-c", "import gguf, accelerate"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", *CONVERSION_EXTRAS], check=True)
    # Dequantising ~270M weights is CPU-bound: hold the machine-wide lock like every other heavy job.
    with open(CPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_converted(out, gguf):
            print(f"converting {gguf} to {out} (bf16)", file=sys.stderr)
            subprocess.run([python, __file__, "--convert-here", str(gguf), str(out)], check=True)
    return out


def convert_here(gguf: Path, out: Path) -> None:
    """The conversion itself, in this interpreter (vLLM's); the stamp goes last, so a cut-short run is redone."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    shutil.rmtree(out, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers 5.19 drops the GGUF's tokenizer.ggml.add_bos_token when it builds Gemma's tokenizer: vLLM then
    # sends the prompt without <bos> (one token fewer than ridgeline, which follows the GGUF) and Gemma, which
    # is trained with it, writes degenerate text. Carry the flag over, so both servers see the same tokens.
    add_bos = GGUFReader(gguf).fields.get("tokenizer.ggml.add_bos_token")
    if add_bos is not None:
        tokenizer.add_bos_token = bool(add_bos.contents())
    # transformers 5.19 keeps GGUF weights packed by default, and refuses to save a model loaded that way
    # ("not serializable"); dequantize=True loads a plain dense model instead.
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
                                                 quantization_config=GgufConfig(dequantize=True))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / STAMP).write_text(json.dumps(source_stamp(gguf)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled Gemma 3 270M Q4_K_M)")
    parser.add_argument("--out", default=None, help=f"output directory (default: under {CACHE_DIR})")
    parser.add_argument("--convert-here", nargs=2, metavar=("GGUF", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.convert_here:  # the worker converted_model starts in vLLM's environment
        convert_here(Path(args.convert_here[0]), Path(args.convert_here[1]))
        return
    from ridgeline.model.checkpoint import resolve_model_path
    from vllm_env import vllm_python

    gguf = resolve_model_path(args.model)
    print(converted_model(gguf, vllm_python(), Path(args.out) if args.out else None))


if __name__ == "__main__":
    main()
