"""`ridgeline perplexity`: score a text file as llama.cpp's llama-perplexity does."""

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress

from ridgeline.cli.app import app
from ridgeline.errors import RidgelineError


@app.command("perplexity", help="Perplexity of FILE in non-overlapping --ctx windows, each scored on its second half "
                                "(as llama-perplexity -c CTX -b CTX). Prints PPL = value ± uncertainty.")
def perplexity_command(
    file: Path = typer.Argument(..., help="UTF-8 text file to score."),
    model: Path = typer.Option(None, "--model", "-m", help="GGUF file, HF directory or smollm2 (default: bundled model)."),
    ctx: int = typer.Option(512, "--ctx", "-c", help="Window length in tokens."),
    threads: int = typer.Option(None, "--threads", help="CPU threads (default: torch's choice)."),
    weights: str = typer.Option("quantized", "--weights", help="quantized (as stored, the engine's path), bf16 or f32 "
                                                               "(dequantised at load)."),
    lm_head: str = typer.Option("keep", "--lm-head", help="keep the LM head as stored, or requantise it to q8 (Q8_0) "
                                                          "or q4 (Q4_0) to measure what that costs in accuracy."),
) -> None:
    if not file.is_file():
        raise RidgelineError(f"text file not found: {file}")
    if ctx < 4:
        raise RidgelineError(f"--ctx must be at least 4, got {ctx}")
    # Imported here, not at the top: every command module is imported for `ridgeline --help`, which needs no torch.
    import torch

    from ridgeline.bench.perplexity import perplexity
    from ridgeline.engine.assemble import assemble_model
    from ridgeline.engine.kv_cache import KVCacheConfig
    from ridgeline.model.checkpoint import read_checkpoint
    from ridgeline.model.transformer import ModelOptions

    if threads:
        torch.set_num_threads(threads)
    console = Console()
    checkpoint = read_checkpoint(model)
    if ctx > checkpoint.config.max_context:
        raise RidgelineError(f"--ctx {ctx} exceeds the model's context of {checkpoint.config.max_context}")
    cache_config = KVCacheConfig(dtype="fp32")
    assembled = assemble_model(checkpoint, ModelOptions(weights=weights, lm_head=lm_head), cache_config,
                               num_blocks=-(-ctx // cache_config.block_size), tokenizer=True)
    del checkpoint
    runner, tokenizer = assembled.runner, assembled.tokenizer
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise RidgelineError(f"{file} is not UTF-8 text: {error}") from None
    ids = tokenizer.encode(text)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("scoring", total=len(ids) // ctx)

        def on_window(done: int, total: int, running: float) -> None:
            progress.update(task, completed=done, description=f"scoring (PPL so far {running:.4f})")

        # llama-perplexity puts BOS in each window's first slot only where the vocabulary adds one (SmolLM2's doesn't)
        result = perplexity(runner, ids, tokenizer.bos_id if tokenizer.add_bos else None, ctx, on_window)
    console.print(f"{result.windows} windows of {ctx} tokens, {result.scored_tokens} tokens scored")
    console.print(f"PPL = {result.perplexity:.4f} ± {result.uncertainty:.4f}", highlight=False)
