"""`ridgeline router CONFIG` (also `ridgeline serve --router CONFIG`): one OpenAI endpoint over several models
and replicas, with the virtual model `auto` (see cluster/config.py for the file)."""

from pathlib import Path

import typer

from ridgeline.cli.app import app
from ridgeline.cli.tenant_options import TENANTS, USAGE_DB


def run_router(config_path: Path, memory: str | None, host: str | None, port: int | None,
               api_key: str | None = None, policy: str | None = None, tenants: Path | None = None,
               usage_db: Path | None = None, drain_timeout: float = 30.0) -> None:
    from ridgeline.engine.options import parse_bytes
    from ridgeline.cluster.build import build_router
    from ridgeline.cluster.config import load_config
    from ridgeline.server.app import ServerConfig
    from ridgeline.server.launcher import configure_logging, run_server
    from ridgeline.server.router_app import create_router_app

    configure_logging()
    gate = None
    if tenants is not None:
        from ridgeline.tenancy.gate import TenantGate

        gate = TenantGate(tenants, usage_db, api_key or None)  # a bad file stops start-up with its reason
    config = load_config(config_path)
    if policy is not None:
        config = with_policy(config, policy)
    budget = parse_bytes(memory) if memory else None
    settings = config.router
    server_config = ServerConfig(host=host or settings.host, port=port if port is not None else settings.port,
                                 api_key=api_key or settings.api_key, drain_timeout=drain_timeout)

    async def build():
        built = await build_router(config, budget)
        print(f"roofline priors: {built.hardware.title}", flush=True)
        for placement in built.placements:
            state = "loaded" if placement.loaded else "LEFT OUT"
            print(f"{placement.backend.model} [{placement.backend.kind}] {state}: {placement.reason}", flush=True)
        return built.router

    if gate is not None:
        gate.api_key = server_config.api_key  # the config's [router] api_key, if --api-key did not give one
    run_server(create_router_app(build, api_key=server_config.api_key, tenants=gate), server_config)


def with_policy(config, policy: str):
    """The config with [router] policy replaced (by --policy)."""
    from dataclasses import replace

    return replace(config, router=replace(config.router, policy=policy))


@app.command("router", help="Serve several models and replicas behind one OpenAI endpoint, with `auto` routing.")
def router_command(
    config: Path = typer.Argument(..., help="Router config (TOML): [router] settings and [[backend]] entries."),
    memory: str = typer.Option(None, "--memory", help="Memory budget, e.g. 16GB: load only the tiers that fit."),
    host: str = typer.Option(None, "--host", help="Address to bind (default: the config's, else 127.0.0.1)."),
    port: int = typer.Option(None, "--port", min=0, max=65535, help="TCP port (default: the config's, else 8000)."),
    api_key: str = typer.Option(None, "--api-key", envvar="RIDGELINE_API_KEY", help="Require 'Authorization: Bearer KEY'."),
    policy: str = typer.Option(None, "--policy", help="Which replica takes a request: cost (prefix cache and load, the default) or round_robin (overrides the config's [router] policy)."),
    tenants: Path = TENANTS,
    usage_db: Path = USAGE_DB,
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", min=0, help="Seconds in-flight requests get on SIGTERM (a second SIGTERM exits at once); what is still in flight then gets the router's own 503 / error event and is cancelled on its replicas."),
) -> None:
    run_router(config, memory, host, port, api_key, policy, tenants, usage_db, drain_timeout)
