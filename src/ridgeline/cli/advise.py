"""`ridgeline advise`: which catalogued machine serves a workload best, and which phase bounds it there."""

import json

import typer
from rich.console import Console
from rich.table import Table

from ridgeline.model.model_source import load_model_shape
from ridgeline.cli.app import app
from ridgeline.napkin.advise import RULES, RequestShape, advise
from ridgeline.napkin.hardware import catalogue


@app.command("advise", help="Rank catalogued machines for a workload by TTFT, tokens/s and time per request.")
def advise_command(
    prompt_tokens: int = typer.Option(..., "--prompt-tokens", min=1, help="Prompt length per request."),
    output_tokens: int = typer.Option(..., "--output-tokens", min=1, help="Tokens generated per request."),
    model: str = typer.Option(None, "--model", help="GGUF file, HF directory or built-in spec name (default: the bundled model)."),
    weights: str = typer.Option(None, "--weights", help="Weight format for a built-in spec (default: as released)."),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Requests decoding at the same time."),
    budget_gb: float = typer.Option(None, "--budget-gb", min=0.1, help="Memory (GB) the model may use on each machine; default: all of it."),
    as_json: bool = typer.Option(False, "--json", help="Print the ranking as JSON."),
) -> None:
    shape = load_model_shape(model, weights)
    request = RequestShape(prompt_tokens, output_tokens, concurrency)
    ranking = advise(shape, catalogue().values(), request, budget_gb * 1e9 if budget_gb else None)
    if as_json:
        rows = [
            {
                "hardware": a.hardware.name,
                "fits": a.fits,
                "why_not": a.why_not,
                "ttft_s": a.ttft_s,
                "tokens_per_s_per_stream": a.tokens_per_s_per_stream,
                "tokens_per_s_total": a.tokens_per_s_total,
                "request_s": a.request_s,
                "bound_by": a.bound_by,
                "prefill_side": a.prefill_side,
                "decode_side": a.decode_side,
            }
            for a in ranking
        ]
        print(json.dumps({"model": shape.name, "weights": shape.weights, "rules": RULES, "ranking": rows}, indent=2))
        return

    console = Console(width=max(Console().width, 110))  # the ranking needs its columns whole
    table = Table(title=f"{shape.name} ({shape.weights}): {prompt_tokens:,} in, {output_tokens:,} out, {concurrency} at a time")
    table.add_column("#", justify="right")
    table.add_column("machine", no_wrap=True)
    for column in ("TTFT s", "tok/s", "total tok/s", "request s"):
        table.add_column(column, justify="right", no_wrap=True)
    for column in ("bound by", "prefill", "decode"):
        table.add_column(column, no_wrap=True)
    fitting = [a for a in ranking if a.fits]
    for rank, a in enumerate(fitting, 1):
        table.add_row(
            str(rank),
            a.hardware.name,
            f"{a.ttft_s:,.2f}",
            f"{a.tokens_per_s_per_stream:,.1f}",
            f"{a.tokens_per_s_total:,.1f}",
            f"{a.request_s:,.1f}",
            a.bound_by,
            a.prefill_side,
            a.decode_side,
        )
    console.print(table)
    for a in ranking[len(fitting) :]:
        console.print(f"[red]does not fit[/] {a.hardware.name}: {a.why_not}")
    console.print("tok/s is per stream. prefill/decode: which side of the ridge each phase sits on there.")
    for number, rule in enumerate(RULES, 1):
        console.print(f"[bold]Rule {number}.[/] {rule}")
