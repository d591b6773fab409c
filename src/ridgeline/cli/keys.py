"""`ridgeline keys new` / `ridgeline keys hash KEY`: API keys for the tenants file, which stores only their hashes."""

import sys

import typer

from ridgeline.cli.app import app

keys_app = typer.Typer(help="API keys for a tenants file (--tenants): make one, or hash one to store.",
                       no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("new", help="Print a new random key (give it to the tenant) and its hash (put it in the file).")
def new_command() -> None:
    from ridgeline.tenancy.keys import hash_key, new_key

    key = new_key()
    print(f"key:  {key}\nhash: {hash_key(key)}")


@keys_app.command("hash", help="Print the hash of KEY (or of one key read from stdin with '-') for the tenants file.")
def hash_command(key: str = typer.Argument(..., help="The key, or '-' to read it from stdin (kept out of shell history).")) -> None:
    from ridgeline.errors import RidgelineError
    from ridgeline.tenancy.keys import hash_key

    if key == "-":
        key = sys.stdin.readline().strip()
    if not key:
        raise RidgelineError("no key to hash: give KEY, or '-' and the key on stdin")
    print(hash_key(key))
