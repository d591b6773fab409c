"""`ridgeline proxy`: one OpenAI endpoint in front of disaggregated prefill and decode workers."""

import typer

from ridgeline.cli.app import app
from ridgeline.cli.disaggregation_options import HANDOFF_WAIT, LOCAL_PREFILL_TOKENS, MAX_REPREFILLS, handoff_config


@app.command("proxy", help="Serve one OpenAI endpoint in front of prefill and decode workers (`ridgeline serve --role prefill|decode`): each prompt is prefilled on a prefill worker, its KV pages move to a decode worker, which streams the answer.")
def proxy_command(
    prefill: list[str] = typer.Option(..., "--prefill", help="A prefill worker's URL (repeat for several)."),
    decode: list[str] = typer.Option(..., "--decode", help="A decode worker's URL (repeat for several)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    local_prefill_tokens: int = LOCAL_PREFILL_TOKENS,
    handoff_wait: float = HANDOFF_WAIT,
    max_reprefills: int = MAX_REPREFILLS,
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", min=0, help="Seconds in-flight requests get on SIGTERM (a second SIGTERM exits at once); what is still in flight then is cancelled on its workers."),
) -> None:
    from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
    from ridgeline.server.launcher import configure_logging, serve_until_signalled

    configure_logging()
    settings = handoff_config(local_prefill_tokens, max_reprefills, handoff_wait)
    app_ = create_front_app(FrontConfig.of(settings, tuple(u.rstrip("/") for u in prefill),
                                           tuple(u.rstrip("/") for u in decode)))
    serve_until_signalled(app_, host, port, drain_timeout)
