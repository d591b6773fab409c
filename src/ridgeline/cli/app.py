"""The `ridgeline` command tree. Each command lives in its own module and registers itself here."""

import typer

app = typer.Typer(
    help="ridgeline: run, serve and measure LLMs, and see which side of the roofline ridge each phase sits on.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
bench_app = typer.Typer(help="Measure: latency (pp/tg), offline throughput, and serving under load.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
