"""The package's layers, as pyproject.toml's import-linter contracts declare them (cli > server, bench > cluster,
sim, dashboard > engine, machine > model > napkin > leaf utilities), hold for the source as it is; and a module that
imports upwards breaks them. import-linter reads the imports from the source (lazy ones inside functions too),
nothing is run."""

import shutil
import subprocess
import sys
from pathlib import Path

import ridgeline

SOURCE = Path(ridgeline.__file__).resolve().parent
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def lint_imports(source_root: Path, config: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the `ridgeline` package found under `source_root`, in a fresh interpreter."""
    command = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", command, str(config), "--no-cache", "--no-logo"],
                          cwd=source_root, env={"PYTHONPATH": str(source_root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def copy_of_the_package(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    shutil.copytree(SOURCE, root / "ridgeline", ignore=shutil.ignore_patterns("__pycache__", "*.so", "static"))
    return root


def test_the_layers_hold():
    result = lint_imports(SOURCE.parent, PYPROJECT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path):
    # A copy of the package, so the working tree is never touched: the engine reaching up into the server (as a
    # config builder once reached into cli/) is refused, named with its module and line.
    root = copy_of_the_package(tmp_path)
    (root / "ridgeline" / "engine" / "reaches_up.py").write_text(
        '"""Deliberately wrong."""\n\n\ndef f():\n    from ridgeline.cli.engine_options import KV_CACHE_DTYPE\n')
    result = lint_imports(root, PYPROJECT)
    assert result.returncode != 0
    assert "1 broken" in result.stdout
    assert "ridgeline.engine is not allowed to import ridgeline.cli" in result.stdout
    assert "ridgeline.engine.reaches_up -> ridgeline.cli.engine_options (l.5)" in result.stdout


def test_packages_of_one_layer_stay_independent(tmp_path):
    # cluster, sim and dashboard share a layer: none of them may stand on another.
    root = copy_of_the_package(tmp_path)
    (root / "ridgeline" / "sim" / "sideways.py").write_text("from ridgeline.cluster import messages\n")
    result = lint_imports(root, PYPROJECT)
    assert result.returncode != 0
    assert "ridgeline.sim.sideways -> ridgeline.cluster.messages (l.1)" in result.stdout
