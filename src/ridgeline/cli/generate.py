"""`ridgeline generate`: stream a completion to the terminal, then report prompt and decode speed."""

import sys
from pathlib import Path

import typer
from rich.console import Console

from ridgeline.cli.app import app
from ridgeline.cli.engine_options import KV_CACHE_DTYPE, KV_CACHE_DTYPE_K, KV_CACHE_DTYPE_V
from ridgeline.engine.options import engine_config


@app.command("generate", help="Generate a completion for PROMPT, streaming tokens as they are produced.")
def generate_command(
    prompt: str = typer.Argument(..., help="The prompt text."),
    model: Path = typer.Option(None, "--model", "-m", help="GGUF file, HF directory or smollm2 (default: bundled Gemma 3 270M Q4_K_M)."),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", help="Most tokens to generate."),
    temperature: float = typer.Option(0.8, "--temperature", "-t", help="Sampling temperature; 0 = greedy."),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling: keep the smallest set with this much probability."),
    top_k: int = typer.Option(40, "--top-k", help="Keep only the K most likely tokens (0 = off)."),
    seed: int = typer.Option(None, "--seed", help="Seed for reproducible sampling."),
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt in the model's chat template as one user turn."),
    threads: int = typer.Option(None, "--threads", help="CPU threads (default: torch's choice)."),
    lm_head: str = typer.Option("keep", "--lm-head", help="keep the LM head as stored, or requantise it to q8 or q4."),
    kv_cache_dtype: str = KV_CACHE_DTYPE,
    kv_cache_dtype_k: str = KV_CACHE_DTYPE_K,
    kv_cache_dtype_v: str = KV_CACHE_DTYPE_V,
) -> None:
    # Imported here, not at the top: every command module is imported for `ridgeline --help`, which needs no torch.
    from ridgeline.engine.llm import LLM
    from ridgeline.engine.sampling_params import SamplingParams

    console = Console(stderr=True)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    params.validate()
    with console.status("loading model"):
        llm = LLM(config=engine_config(model, threads=threads, lm_head=lm_head, kv_cache_dtype=kv_cache_dtype,
                                       kv_cache_dtype_k=kv_cache_dtype_k, kv_cache_dtype_v=kv_cache_dtype_v))
    tokens: list[int] | str = prompt
    if chat:
        text = llm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        tokens = llm.tokenizer.encode(text, special=True)
    last = None
    for output in llm.stream(tokens, params):
        sys.stdout.write(output.new_text)
        sys.stdout.flush()
        last = output
    sys.stdout.write("\n")
    timings = last.timings
    prompt_tokens, generated = len(last.prompt_token_ids), len(last.output_token_ids)
    prefill_s = timings.first_token - timings.first_scheduled
    decode_s = timings.token_times[-1] - timings.first_token
    console.print(
        f"prompt: {prompt_tokens} tokens, {prompt_tokens / prefill_s:.1f} tok/s | "
        f"decode: {generated} tokens, {(generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0:.1f} tok/s | "
        f"finish: {last.finish_reason}", highlight=False)
