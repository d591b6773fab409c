"""`ridgeline inspect`: what is in a model file."""

from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from ridgeline.cli.app import app


@app.command("inspect", help="Print a model's architecture, hyper-parameters, bytes per tensor type, parameter count "
                             "and KV-cache bytes per token.")
def inspect_command(
    model: Path = typer.Argument(None, help="GGUF file or Hugging Face directory (default: the bundled Gemma 3 270M Q4_K_M)."),
) -> None:
    # Imported here, not at the top: every command module is imported for `ridgeline --help`, which needs no torch.
    from ridgeline.model.checkpoint import read_checkpoint
    from ridgeline.model.summary import summarize

    checkpoint = read_checkpoint(model)
    summary = summarize(checkpoint)
    console = Console()
    console.print(f"[bold]{checkpoint.path}[/] ({checkpoint.format})")
    params = Table("hyper-parameter", "value", title=f"architecture: {checkpoint.config.architecture}")
    for key, value in asdict(checkpoint.config).items():
        if key == "sliding_layers":
            value = f"{len(value)} of {checkpoint.config.num_layers} layers" if value else "none"
        params.add_row(key, str(value))
    console.print(params)
    types = Table("type", "tensors", "parameters", "bytes", "bits/weight", title="weights by stored type")
    for group in summary.by_type:
        types.add_row(group.type_name, str(group.tensors), f"{group.parameters:,}", f"{group.nbytes:,}",
                      f"{group.bits_per_weight:.2f}")
    types.add_row("total", "", f"{summary.parameters:,}", f"{summary.nbytes:,}",
                  f"{8 * summary.nbytes / summary.parameters:.2f}", style="bold")
    console.print(types)
    config = checkpoint.config
    formula = f"2 × {config.num_kv_heads} kv_heads × {config.head_dim} head_dim × {config.num_layers} layers × bytes"
    console.print(f"KV cache per token ({formula}): "
                  + ", ".join(f"{int(v):,} B ({k})" for k, v in summary.kv_bytes_per_token.items()))
