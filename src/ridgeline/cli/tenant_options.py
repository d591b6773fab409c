"""The tenants options `serve` and `router` share (docs/tenants.md)."""

from pathlib import Path

import typer

TENANTS = typer.Option(None, "--tenants", help="Tenants file (TOML): hashed API keys, each tenant's limits (requests "
                       "and tokens per minute, tokens per day), priority class and prices; reloaded on SIGHUP. "
                       "--api-key still works beside it, as an unlimited admin key.")
USAGE_DB = typer.Option(None, "--usage-db", help="SQLite file of the tenants' usage, shared by every server pointing "
                        "at it (default: beside the tenants file, NAME.usage.sqlite).")
