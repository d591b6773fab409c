"""Entry point: import every command module (they register on `app`), run, and turn user errors into one line."""

import importlib
import pkgutil
import sys

from rich.console import Console

from ridgeline.cli.app import app
from ridgeline.errors import RidgelineError


def _register_commands() -> None:
    for module in pkgutil.iter_modules(__path__):
        if module.name != "app":
            importlib.import_module(f"{__name__}.{module.name}")


def main() -> None:
    _register_commands()
    try:
        app()
    except RidgelineError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
