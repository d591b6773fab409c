"""`ridgeline --help` and the napkin commands (roofline, advise and simulate on built-in specs and catalogued
machines) run without importing torch: every command module is imported to build the help, so each imports the
engine, the model and torch only inside its command; a named command imports only its own module. Run in a fresh
interpreter, as a user would start it."""

import subprocess
import sys

import pytest

from ridgeline.cli import command_modules, modules_for

RUN_CLI = """
import sys
from ridgeline.cli import main
sys.argv = ["ridgeline", *sys.argv[1:]]
try:
    main()
    code = 0
except SystemExit as exit:
    code = exit.code or 0
print(f"exit={code} torch={'torch' in sys.modules}", file=sys.stderr)
print(f"matplotlib={'matplotlib' in sys.modules} bench_client={'ridgeline.bench.bench_serve' in sys.modules}", file=sys.stderr)
"""


@pytest.mark.parametrize("args", [
    ["--help"],
    ["bench", "--help"],
    ["roofline", "--model", "llama-3.1-8b", "--weights", "Q4_K_M", "--hardware", "apple-m4-max", "--json"],
    ["advise", "--prompt-tokens", "500", "--output-tokens", "200", "--model", "llama-3.1-8b", "--json"],
    # The simulator runs the real scheduler and admission (which compiles grammars) but no model: ~2 s of torch saved
    ["simulate", "--model", "llama-3.1-8b", "--weights", "Q4_K_M", "--hardware", "nvidia-h100-sxm", "--num-prompts",
     "20", "--json"],
], ids=lambda args: " ".join(args[:2]))
def test_command_runs_without_importing_torch(args):
    result = subprocess.run([sys.executable, "-c", RUN_CLI, *args], capture_output=True, text=True, timeout=120)
    assert result.stderr.strip().splitlines()[-2] == "exit=0 torch=False", result.stderr


def test_the_check_sees_torch_when_a_command_imports_it():
    # The same probe on a command that loads a model must see torch, or the test above proves nothing.
    result = subprocess.run([sys.executable, "-c", RUN_CLI, "inspect", "/nonexistent/model.gguf"],
                            capture_output=True, text=True, timeout=120)
    assert result.stderr.strip().splitlines()[-2] == "exit=1 torch=True", result.stderr


def test_a_command_imports_only_its_own_module():
    # `serve` must not pay for matplotlib and the benchmark client at every start (half a second of a warm start
    # that should take under 3 s); help still lists every command.
    result = subprocess.run([sys.executable, "-c", RUN_CLI, "serve", "--help"], capture_output=True, text=True, timeout=120)
    assert result.stderr.strip().splitlines()[-1] == "matplotlib=False bench_client=False", result.stderr
    result = subprocess.run([sys.executable, "-c", RUN_CLI, "--help"], capture_output=True, text=True, timeout=120)
    assert result.stderr.strip().splitlines()[-1] == "matplotlib=True bench_client=True", result.stderr
    assert "simulate" in result.stdout and "serve" in result.stdout


def test_the_command_module_is_found_from_the_first_words():
    everything = command_modules()
    assert modules_for(["serve", "--port", "0"]) == ["serve"]
    assert modules_for(["bench", "latency", "--json"]) == ["bench_latency"]
    assert modules_for(["--help"]) == everything
    assert modules_for(["bench", "--help"]) == everything
    assert modules_for(["no-such-command"]) == everything  # typer then names the unknown command
