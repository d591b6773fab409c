"""`ridgeline synth --shape NAME --weights TYPE`: a random-weight GGUF of a catalogued model shape, to measure a
model's speed and memory on this machine before downloading it (a decode step's cost does not depend on what the
weights hold)."""

from pathlib import Path

import typer

from ridgeline.cli.app import app


@app.command("synth", help="Write a random-weight GGUF of a catalogued model shape (llama-3.1-8b, qwen2.5-1.5b, "
             "qwen3-30b-a3b, gpt-oss-20b, ...), quantised as asked, with a real tokenizer: for measuring, not for text.")
def synth_command(
    shape: str = typer.Option(..., "--shape", help="A catalogued model shape: llama-3.2-1b, llama-3.1-8b, qwen2.5-1.5b, qwen3-8b, qwen3-30b-a3b, gpt-oss-20b, ... (an unknown name lists them all)."),
    weights: str = typer.Option("q4_k_m", "--weights", help="f16, q8_0, q4_0, q4_k, q4_k_m, q6_k, or mxfp4 (MoE experts)."),
    output: Path = typer.Option(None, "--output", "-o", help="The file to write (default: a name naming every option, here)."),
    layers: int = typer.Option(None, "--layers", min=1, help="Keep only the first N layers (a quicker, smaller file)."),
    seed: int = typer.Option(0, "--seed", min=0, help="The same seed and options write the same bytes."),
    vocab: int = typer.Option(None, "--vocab", min=1, help="Cut or pad the vocabulary to N tokens (default: the shape's)."),
) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from ridgeline.model.synth.writer import SynthOptions, write_synth

    options = SynthOptions(shape, weights, layers, seed, vocab)
    path = output or Path(options.file_name)  # resolves the options: a bad shape or type fails before any output
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), transient=True) as bar:
        task = bar.add_task(f"writing {path.name}", total=None)
        write_synth(path, options, progress=lambda done, total: bar.update(task, completed=done, total=total))
    print(f"{path}: {path.stat().st_size / 1e9:,.2f} GB, {options.shape} with {options.weights} weights "
          f"(seed {options.seed}; random weights)")
