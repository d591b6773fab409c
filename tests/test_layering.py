"""What the layers between packages (pyproject.toml's import-linter contracts, tests/test_import_contracts.py) do not
say, read from the source with `ast` (nothing is imported or run):

- napkin/ is plain arithmetic: it imports only the standard library, numpy, matplotlib, ridgeline.errors and itself,
  so the roofline and advise tools run without torch, the engine or a model;
- model/attention_batch.py, which model/layers/ consume, does not import from model/layers/.

Every import counts, including those inside functions.
"""

import ast
import sys
from pathlib import Path

import pytest

import ridgeline

PACKAGE = Path(ridgeline.__file__).parent
NAPKIN_MAY_IMPORT = {"numpy", "matplotlib", "ridgeline.errors", "ridgeline.napkin"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module `path` imports (`from a import b` counts as both a and a.b)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def within(name: str, prefixes) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def modules_under(folder: str) -> list[Path]:
    paths = sorted((PACKAGE / folder).rglob("*.py"))
    assert paths, f"no modules under {folder}/"
    return paths


def test_imports_are_resolved_from_the_source():
    # The reader itself, on a module whose imports are known: relative and absolute, top level and lazy.
    names = imported_modules(PACKAGE / "napkin" / "roofline.py")
    assert "ridgeline.napkin.hardware" in names and "math" in names
    assert "ridgeline.napkin.model_specs" in imported_modules(PACKAGE / "model" / "model_source.py")


@pytest.mark.parametrize("path", modules_under("napkin"), ids=lambda p: p.name)
def test_napkin_imports_only_stdlib_numpy_matplotlib_and_itself(path):
    outside = {name for name in imported_modules(path)
               if name.split(".")[0] not in sys.stdlib_module_names and not within(name, NAPKIN_MAY_IMPORT)}
    assert not outside, f"{path.relative_to(PACKAGE)} imports {sorted(outside)}"


def test_attention_batch_does_not_import_from_the_layers_that_use_it():
    names = imported_modules(PACKAGE / "model" / "attention_batch.py")
    assert "ridgeline.model.row_paths" in names  # what it used to fetch from layers/linear.py
    assert not {name for name in names if within(name, ["ridgeline.model.layers"])}
