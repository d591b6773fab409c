"""`ridgeline proxy`: one OpenAI endpoint in front of disaggregated prefill and decode workers."""

import typer

from ridgeline.cli.app import app


@app.command("proxy", help="Serve one OpenAI endpoint in front of prefill and decode workers (`ridgeline serve --role prefill|decode`): each prompt is prefilled on a prefill worker, its KV pages move to a decode worker, which streams the answer.")
def proxy_command(
    prefill: list[str] = typer.Option(..., "--prefill", help="A prefill worker's URL (repeat for several)."),
    decode: list[str] = typer.Option(..., "--decode", help="A decode worker's URL (repeat for several)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    local_prefill_tokens: int = typer.Option(64, "--local-prefill-tokens", min=0, help="Prompts shorter than this are prefilled on the decode worker: below it moving the KV costs more than the prefill it saves."),
    handoff_wait: float = typer.Option(30.0, "--handoff-wait", min=0, help="Seconds a prefilled request waits here, its KV pages kept, for a decode worker whose KV queue is full to take it, before a 503 with Retry-After."),
    max_reprefills: int = typer.Option(2, "--max-reprefills", min=0, help="Times one request is prefilled again when its held KV pages are gone before the decode worker pulls them (a lapsed lease, a restarted prefill worker); past it, 503 with Retry-After."),
) -> None:
    import uvicorn

    from ridgeline.server.disaggregated_front import FrontConfig, create_front_app
    from ridgeline.server.launcher import configure_logging

    configure_logging()
    app_ = create_front_app(FrontConfig(tuple(u.rstrip("/") for u in prefill), tuple(u.rstrip("/") for u in decode),
                                        local_prefill_tokens, max_reprefills=max_reprefills,
                                        handoff_wait=handoff_wait))
    uvicorn.run(app_, host=host, port=port, access_log=False, log_level="info")
