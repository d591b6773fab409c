"""`ridgeline measure`: measure this machine's roofline for a thread count and cache it (machine/this_machine.py)."""

import json

import typer
from rich.console import Console

from ridgeline.cli.app import app


@app.command("measure", help="Measure this machine's bandwidth and matmul FLOP/s for a thread count and cache them: "
                             "the roof of /dashboard, bench and roofline --hardware this-machine.")
def measure_command(
    threads: int = typer.Option(None, "--threads", min=1, help="Threads to measure with (default: torch's, the engine's default)."),
    force: bool = typer.Option(False, "--force", help="Replace the cached entry even where this run reads worse (a busy machine reads low)."),
    show: bool = typer.Option(False, "--list", help="Show the cached entries for this machine; measure nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the entries as JSON."),
) -> None:
    from ridgeline.machine.this_machine import cache_path, cached_entries, measure_and_cache

    console = Console(stderr=as_json)
    if show:
        entries = cached_entries()
        if as_json:
            print(json.dumps([entry.to_json() for entry in entries], indent=2))
        for entry in entries:
            console.print(entry.hardware.title, highlight=False, soft_wrap=True)
        if not entries:
            console.print(f"no measurement of this machine cached in {cache_path()}", highlight=False)
        return
    with console.status("measuring this machine (~7 s; ~2 min more where the compiled kernels were never built)"):
        outcome = measure_and_cache(threads, force)
    if as_json:
        print(json.dumps({"replaced": outcome.replaced, "note": outcome.note, "kept": outcome.kept.to_json(),
                          "measured": outcome.measured.to_json()}, indent=2))
    console.print(outcome.note, highlight=False, soft_wrap=True)
    if outcome.kept.provenance.noisy:
        console.print("[yellow]noisy:[/] the rounds differ widely; measure again when the machine is quiet",
                      highlight=False)
