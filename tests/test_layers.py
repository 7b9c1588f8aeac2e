"""The folders of dalign_core are layers: a module imports only its own layer and those below it.

The order, bottom first (the README's "how the code is laid out" and each subpackage's docstring say the same):
the top-level helpers; geometry, data and models; capture; training; sweep; report; studies; claims;
experiments and the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dalign_core"

LAYERS = {
    "": 0, "_env": 0, "_tensor": 0, "atomic": 0, "config": 0,
    "geometry": 1, "data": 1, "models": 1,
    "capture": 2,
    "training": 3,
    "sweep": 4,
    "report": 5,
    "studies": 6,
    "claims": 7,
    "experiments": 8, "cli": 8, "__main__": 9,
}


def _layer(module: str) -> tuple[str, int]:
    """``(room, floor)`` of a dotted module name inside dalign_core."""
    parts = module.split(".")[1:]
    room = parts[0] if parts else ""
    if room and not (PACKAGE / room).is_dir() and not (PACKAGE / f"{room}.py").is_file():
        room = ""  # a name the package itself defines (``from dalign_core import __version__``)
    if room not in LAYERS:
        raise AssertionError(f"{module}: dalign_core/{room} is in no layer; add it to LAYERS and the README")
    return room, LAYERS[room]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every dalign_core module ``path`` imports (at any depth of the file), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dalign_core"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "dalign_core":
            base = node.module
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_upward(path):
    here, floor = _layer(_name(path))
    upward = []
    for line, target in _imports(path):
        room, target_floor = _layer(target)  # the room of ``from dalign_core.X.y import z`` is X
        if target_floor > floor and room != here:
            upward.append(f"line {line}: {target} ({room}, floor {target_floor})")
    assert not upward, f"{path.relative_to(PACKAGE)} (floor {floor}) imports upward: " + "; ".join(upward)


def test_every_subpackage_says_what_it_holds_and_may_import():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.splitlines()) >= 2, f"{init.relative_to(PACKAGE)} needs a docstring of what it holds"
    for room in ("geometry", "capture", "training", "sweep", "report", "studies", "claims", "cli"):
        doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
        assert "May import" in doc, f"dalign_core/{room}/__init__.py must say what it may import"


def test_the_flat_folder_holds_only_the_helpers():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "_env.py", "_tensor.py", "atomic.py", "config.py"], loose


def test_public_names_stay_importable_from_the_package():
    import dalign_core

    for name in dalign_core.__all__:
        assert getattr(dalign_core, name) is not None
    assert callable(dalign_core.activation_gradients) and callable(dalign_core.estimate_geometry)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_imports(path):
    """A name moved to another module leaves no importer behind (an import inside a function counts too)."""
    import importlib

    module = importlib.import_module(_name(path))
    for line, target in _imports(path):
        head, _, leaf = target.rpartition(".")
        try:
            importlib.import_module(target)
        except ModuleNotFoundError:
            assert hasattr(importlib.import_module(head), leaf), f"{module.__name__} line {line}: no {target}"


def test_a_reader_takes_in_each_module_at_once():
    """No module past about 500 lines: a longer one holds two concepts, which belong in two modules."""
    long = {str(p.relative_to(PACKAGE)): n for p in _modules() if (n := len(p.read_text().splitlines())) > 520}
    assert not long, f"modules past ~500 lines: {long}"
