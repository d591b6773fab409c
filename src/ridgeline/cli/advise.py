"""`ridgeline advise`: which catalogued machine serves a workload best, and which phase bounds it there."""

import json

import typer
from rich.console import Console
from rich.table import Table

from ridgeline.model.model_source import load_model_shape
from ridgeline.cli.app import app
from ridgeline.napkin.advise import RULES, RequestShape, Slo, advise
from ridgeline.napkin.hardware import catalogue


@app.command("advise", help="Rank catalogued machines for a workload by TTFT, tokens/s and time per request.")
def advise_command(
    prompt_tokens: int = typer.Option(..., "--prompt-tokens", min=1, help="Prompt length per request."),
    output_tokens: int = typer.Option(..., "--output-tokens", min=1, help="Tokens generated per request."),
    model: str = typer.Option(None, "--model", help="GGUF file, HF directory or built-in spec name (default: the bundled model)."),
    weights: str = typer.Option(None, "--weights", help="Weight format for a built-in spec (default: as released)."),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Requests decoding at the same time."),
    budget_gb: float = typer.Option(None, "--budget-gb", min=0.1, help="Memory (GB) the model may use on each machine; default: all of it."),
    usd_per_hour: float = typer.Option(None, "--usd-per-hour", min=0, help="Price every machine at this many US dollars an hour instead of its catalogued price."),
    slo_ttft_ms: float = typer.Option(None, "--slo-ttft-ms", min=0, help="SLO: time to first token, ms. With an SLO each machine is priced at the most concurrent requests that meet it."),
    slo_itl_ms: float = typer.Option(None, "--slo-itl-ms", min=0, help="SLO: inter-token latency, ms."),
    as_json: bool = typer.Option(False, "--json", help="Print the ranking as JSON."),
) -> None:
    shape = load_model_shape(model, weights)
    request = RequestShape(prompt_tokens, output_tokens, concurrency)
    slo = Slo(slo_ttft_ms / 1000 if slo_ttft_ms is not None else None, slo_itl_ms / 1000 if slo_itl_ms is not None else None)
    slo = slo if slo != Slo() else None
    ranking = advise(shape, catalogue().values(), request, budget_gb * 1e9 if budget_gb else None, usd_per_hour, slo)
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
                "concurrency": a.concurrency,
                "meets_slo": a.meets_slo,
                "cost": a.cost.as_dict() if a.cost else None,
                "price_source": "--usd-per-hour" if usd_per_hour is not None else a.hardware.price.source if a.hardware.price else None,
            }
            for a in ranking
        ]
        print(json.dumps({"model": shape.name, "weights": shape.weights, "rules": RULES, "ranking": rows,
                          "slo": {"ttft_ms": slo_ttft_ms, "itl_ms": slo_itl_ms}}, indent=2))
        return

    console = Console(width=max(Console().width, 170))  # the ranking needs its columns whole
    table = Table(title=f"{shape.name} ({shape.weights}): {prompt_tokens:,} in, {output_tokens:,} out, {concurrency} at a time"
                  + (" (each machine at the most that meet the SLO: batch)" if slo else ""))
    table.add_column("#", justify="right")
    table.add_column("machine", no_wrap=True)
    for column in ("TTFT s", "tok/s", "total tok/s", "request s", "batch", "$/h", "$/Mtok in", "$/Mtok out", "$/Mtok all"):
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
            str(a.concurrency) + ("" if a.meets_slo else " (misses SLO)"),
            *money(a),
            a.bound_by,
            a.prefill_side,
            a.decode_side,
        )
    console.print(table)
    for a in ranking[len(fitting) :]:
        console.print(f"[red]does not fit[/] {a.hardware.name}: {a.why_not}")
    console.print("tok/s is per stream. prefill/decode: which side of the ridge each phase sits on there. "
                  "$/Mtok: the machine's hourly price over the tokens it serves an hour at that batch, kept busy "
                  "(prices and their sources: docs/cost.md).")
    for number, rule in enumerate(RULES, 1):
        console.print(f"[bold]Rule {number}.[/] {rule}")


def money(a) -> tuple[str, str, str, str]:
    if a.cost is None:
        return ("-",) * 4

    def usd(value: float | None) -> str:
        return "-" if value is None else f"{value:,.3f}" if value < 10 else f"{value:,.1f}"

    return (f"{a.cost.usd_per_hour:,.3f}", usd(a.cost.prompt_usd_per_mtok), usd(a.cost.completion_usd_per_mtok),
            usd(a.cost.blended_usd_per_mtok))
