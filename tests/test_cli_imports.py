"""`ridgeline --help` and the napkin commands (roofline and advise on built-in specs and catalogued machines) run
without importing torch: every command module is imported to build the help, so each imports the engine, the model
and torch only inside its command. Run in a fresh interpreter, as a user would start it."""

import subprocess
import sys

import pytest

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
"""


@pytest.mark.parametrize("args", [
    ["--help"],
    ["bench", "--help"],
    ["roofline", "--model", "llama-3.1-8b", "--weights", "Q4_K_M", "--hardware", "apple-m4-max", "--json"],
    ["advise", "--prompt-tokens", "500", "--output-tokens", "200", "--model", "llama-3.1-8b", "--json"],
], ids=lambda args: " ".join(args[:2]))
def test_command_runs_without_importing_torch(args):
    result = subprocess.run([sys.executable, "-c", RUN_CLI, *args], capture_output=True, text=True, timeout=120)
    assert result.stderr.strip().splitlines()[-1] == "exit=0 torch=False", result.stderr


def test_the_check_sees_torch_when_a_command_imports_it():
    # The same probe on a command that loads a model must see torch, or the test above proves nothing.
    result = subprocess.run([sys.executable, "-c", RUN_CLI, "inspect", "/nonexistent/model.gguf"],
                            capture_output=True, text=True, timeout=120)
    assert result.stderr.strip().splitlines()[-1] == "exit=1 torch=True", result.stderr
