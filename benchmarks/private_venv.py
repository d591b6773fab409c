"""A private virtual environment for one heavy tool a benchmark drives (llama-cpp-python, lm-eval), built on first
use under a machine-wide lock and never touching the project's own environment."""

import fcntl
import subprocess
import sys
import venv
from pathlib import Path


def private_python(venv_dir: Path, requirement: str, probe: str, lock: Path, env: dict[str, str] | None = None,
                   note: str = "", pip_args: tuple[str, ...] = ()) -> Path:
    """The environment's interpreter once `import {probe}` works in it, installing `requirement` first if needed
    (`pip_args` go to that `pip install`: an extra index, say)."""
    python = venv_dir / "bin" / "python"
    if _imports(python, probe):
        return python
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if not _imports(python, probe):  # another process may have built it while we waited
            print(f"installing {requirement} into {venv_dir}{note}", file=sys.stderr)
            venv.create(venv_dir, with_pip=True, clear=True)
            (venv_dir / ".gitignore").write_text("*\n")
            subprocess.run([python, "-m", "pip", "install", "--no-cache-dir", *pip_args, requirement], check=True,
                           env=env)
    return python


def _imports(python: Path, probe: str) -> bool:
    return python.exists() and subprocess.run([python, "-c", f"import {probe}"], capture_output=True).returncode == 0
