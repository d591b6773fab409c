"""The package layering, read from the source with `ast` (nothing is imported or run):

- napkin/ is plain arithmetic: it imports only the standard library, numpy, matplotlib, ridgeline.errors and itself,
  so the roofline and advise tools run without torch, the engine or a model;
- engine/ and model/ never import the server (the server drives the engine, never the reverse);
- engine/ never imports cluster/, and cluster/ never imports the server: the one engine-thread driver
  (engine/engine_thread.py) sits below both fronts, the one-model server and the router's workers;
- engine/ never imports sim/: the simulator runs the engine's scheduler, and hands it its step-time model
  (a plain callable) where the scheduler needs one;
- model/attention_batch.py, which model/layers/ consume, does not import from model/layers/;
- tenancy/ (keys, limits, usage) is below every front: it imports none of server/, cluster/, engine/ or model/.

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
    assert "ridgeline.napkin.model_specs" in imported_modules(PACKAGE / "bench" / "model_source.py")


@pytest.mark.parametrize("path", modules_under("napkin"), ids=lambda p: p.name)
def test_napkin_imports_only_stdlib_numpy_matplotlib_and_itself(path):
    outside = {name for name in imported_modules(path)
               if name.split(".")[0] not in sys.stdlib_module_names and not within(name, NAPKIN_MAY_IMPORT)}
    assert not outside, f"{path.relative_to(PACKAGE)} imports {sorted(outside)}"


@pytest.mark.parametrize("path", [*modules_under("engine"), *modules_under("model")],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_engine_and_model_never_import_the_server(path):
    server = {name for name in imported_modules(path) if within(name, ["ridgeline.server"])}
    assert not server, f"{path.relative_to(PACKAGE)} imports {sorted(server)}"


@pytest.mark.parametrize("path", modules_under("engine"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_engine_never_imports_the_cluster(path):
    cluster = {name for name in imported_modules(path) if within(name, ["ridgeline.cluster"])}
    assert not cluster, f"{path.relative_to(PACKAGE)} imports {sorted(cluster)}"


@pytest.mark.parametrize("path", modules_under("engine"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_engine_never_imports_the_simulator(path):
    sim = {name for name in imported_modules(path) if within(name, ["ridgeline.sim"])}
    assert not sim, f"{path.relative_to(PACKAGE)} imports {sorted(sim)}"


@pytest.mark.parametrize("path", modules_under("cluster"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_cluster_never_imports_the_server(path):
    server = {name for name in imported_modules(path) if within(name, ["ridgeline.server"])}
    assert not server, f"{path.relative_to(PACKAGE)} imports {sorted(server)}"


@pytest.mark.parametrize("path", modules_under("tenancy"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_tenancy_imports_no_front_and_no_engine(path):
    above = {name for name in imported_modules(path)
             if within(name, ["ridgeline.server", "ridgeline.cluster", "ridgeline.engine", "ridgeline.model"])}
    assert not above, f"{path.relative_to(PACKAGE)} imports {sorted(above)}"


def test_attention_batch_does_not_import_from_the_layers_that_use_it():
    names = imported_modules(PACKAGE / "model" / "attention_batch.py")
    assert "ridgeline.model.row_paths" in names  # what it used to fetch from layers/linear.py
    assert not {name for name in names if within(name, ["ridgeline.model.layers"])}
