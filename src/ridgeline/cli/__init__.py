"""Entry point: import the command modules (they register on `app`), run, and turn user errors into one line.

Only the module of the command being run is imported when argv names one (`serve`, `bench latency`): the
others pull in matplotlib, the benchmark clients and the simulator, half a second of imports that a server's
start-up would pay for nothing. `--help` and anything unrecognised import them all, so help lists every command.
"""

import importlib
import pkgutil
import sys

from rich.console import Console

from ridgeline.cli.app import app
from ridgeline.errors import RidgelineError


def command_modules() -> list[str]:
    return [module.name for module in pkgutil.iter_modules(__path__) if module.name != "app"]


def modules_for(argv: list[str]) -> list[str]:
    """The command modules `ridgeline ARGV` needs: the one named by its first words, or all of them."""
    known = command_modules()
    words = [word for word in argv[:2] if not word.startswith("-")]
    # `bench latency` lives in bench_latency.py, `serve` in serve.py.
    for length in (2, 1):
        name = "_".join(words[:length])
        if len(words) >= length and name in known:
            return [name]
    return known


def register_commands(argv: list[str] | None = None) -> None:
    """Import the command modules `ridgeline ARGV` needs (every one without ARGV) so they register on `app`."""
    for name in command_modules() if argv is None else modules_for(argv):
        importlib.import_module(f"{__name__}.{name}")


def main() -> None:
    register_commands(sys.argv[1:])
    try:
        app()
    except RidgelineError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
