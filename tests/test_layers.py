"""Two packages, one direction: dalign_core never imports dalign_repro, and inside each package a module imports
only its own room and the rooms below it.

dalign_core, bottom first: the top-level helpers (atomic writes, environment flags, devices); geometry; capture;
growth (what a growth method reads at a point); the command line. dalign_repro sits on all of dalign_core: its config; data and models; training; sweep; the model families' specs
(beside report); studies; claims; experiments. The README's "how the code is laid out" and each subpackage's docstring say the same.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    "dalign_core": {"": 0, "_tensor": 0, "atomic": 0, "device": 0, "environment": 0, "seeding": 0,
                    "geometry": 1, "capture": 2, "growth": 3, "cli": 4, "__main__": 5},
    "dalign_repro": {"": 0, "config": 0, "data": 1, "models": 1, "training": 2, "sweep": 3, "families": 4, "report": 4,
                     "studies": 5, "claims": 6, "experiments": 7, "__main__": 8},
}
"""The floor of each room; a module of dalign_repro may import any of dalign_core (floor -1 from there)."""


def _layer(module: str) -> tuple[str, str, int]:
    """``(package, room, floor)`` of a dotted module name inside either package."""
    package, *parts = module.split(".")
    room = parts[0] if parts else ""
    folder = ROOT / package
    if room and not (folder / room).is_dir() and not (folder / f"{room}.py").is_file():
        room = ""  # a name the package itself defines (``from dalign_core import __version__``)
    if room not in LAYERS[package]:
        raise AssertionError(f"{module}: {package}/{room} is in no layer; add it to LAYERS and the README")
    return package, room, LAYERS[package][room]


def _modules() -> list[Path]:
    return sorted(p for package in LAYERS for p in (ROOT / package).rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every dalign_core or dalign_repro module ``path`` imports (at any depth of the file), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in LAYERS]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in LAYERS:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def test_no_module_imports_upward():
    upward = []
    for path in _modules():
        package, here, floor = _layer(_name(path))
        for line, target in _imports(path):
            target_package, room, target_floor = _layer(target)
            if target_package != package:
                if package == "dalign_core":  # the core knows nothing of the reproduction
                    upward.append(f"{path.relative_to(ROOT)} line {line}: {target} (the reproduction)")
                continue
            if target_floor > floor and room != here:
                upward.append(f"{path.relative_to(ROOT)} (floor {floor}) line {line}: {target} ({room}, floor "
                              f"{target_floor})")
    assert not upward, "imports upward: " + "; ".join(upward)


def test_every_subpackage_says_what_it_holds_and_may_import():
    for package in LAYERS:
        for init in sorted((ROOT / package).glob("*/__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            assert len(doc.splitlines()) >= 2, f"{init.relative_to(ROOT)} needs a docstring of what it holds"
    rooms = {"dalign_core": ("geometry", "capture", "growth", "cli"),
             "dalign_repro": ("training", "sweep", "families", "report", "studies", "claims", "experiments")}
    for package, names in rooms.items():
        for room in names:
            doc = ast.get_docstring(ast.parse((ROOT / package / room / "__init__.py").read_text()))
            assert "May import" in doc, f"{package}/{room}/__init__.py must say what it may import"


def test_the_sweep_never_reaches_an_experiment_or_a_family():
    """The sweep's steps call only the answers of the spec they are given: no module of dalign_repro/sweep imports
    an experiment (whose callbacks the sweep used to climb back into) or looks a family up in the registry."""
    reached = []
    for path in sorted((ROOT / "dalign_repro" / "sweep").rglob("*.py")):
        for line, target in _imports(path):
            if target.split(".")[:2] in (["dalign_repro", "experiments"], ["dalign_repro", "families"]):
                reached.append(f"{path.relative_to(ROOT)} line {line}: {target}")
    assert not reached, "the sweep imports upward: " + "; ".join(reached)
    assert len(list((ROOT / "dalign_repro" / "sweep").rglob("*.py"))) > 5  # the walk saw the sweep's modules


def test_every_registered_family_lives_in_the_families_package():
    from dalign_repro.families import FAMILIES

    assert set(FAMILIES) >= {"llama", "llama_depth", "llama_context", "pythia", "resnet"}
    for name, spec in FAMILIES.items():
        assert spec.name == name and type(spec).__module__.startswith("dalign_repro.families."), (name, spec)


def test_the_flat_folders_hold_only_the_helpers():
    loose = sorted(p.name for p in (ROOT / "dalign_core").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "_tensor.py", "atomic.py", "device.py", "environment.py",
                     "seeding.py"], loose
    loose = sorted(p.name for p in (ROOT / "dalign_repro").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "config.py"], loose


def test_public_names_stay_importable_from_the_package():
    import dalign_core

    for name in dalign_core.__all__:
        assert getattr(dalign_core, name) is not None
    assert callable(dalign_core.activation_gradients) and callable(dalign_core.estimate_geometry)


def test_every_module_imports():
    """A name moved to another module leaves no importer behind (an import inside a function counts too)."""
    missing = []
    for path in _modules():
        module = importlib.import_module(_name(path))
        for line, target in _imports(path):
            head, _, leaf = target.rpartition(".")
            try:
                importlib.import_module(target)
            except ModuleNotFoundError:
                if not hasattr(importlib.import_module(head), leaf):
                    missing.append(f"{module.__name__} line {line}: no {target}")
    assert not missing, "; ".join(missing)


def test_no_import_cycle_between_modules():
    """No two modules import each other, directly or round a longer loop (at any depth of the file, type-only
    imports included): a cycle means two concepts that are one, or one split in the wrong place."""
    names = {_name(path): path for path in _modules()}
    edges = {name: {t for _, target in _imports(path) for t in (target, target.rpartition(".")[0])
                    if t in names and t != name and not (ROOT / Path(*t.split("."))).is_dir()}
             for name, path in names.items()}
    cycles, state = [], {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(edges[name]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[name] = "done"

    for name in sorted(names):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(cycles)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_crosses_a_module_of_the_core():
    """Inside dalign_core a module imports from another only that module's public names (``from m import _x`` and
    ``m._x`` are refused): what siblings share is the module's API. The top-level ``_tensor`` may be imported
    whole by the core's own modules; it is private to the package, not to a module."""
    crossing = []
    for path in sorted((ROOT / "dalign_core").rglob("*.py")):
        here = _name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        modules = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dalign_core"):
                for alias in node.names:
                    if _private(alias.name) and node.module != here:
                        crossing.append(f"{path.relative_to(ROOT)} line {node.lineno}: {node.module}.{alias.name}")
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                modules.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("dalign_core")})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in modules):
                crossing.append(f"{path.relative_to(ROOT)} line {node.lineno}: {modules[node.value.id]}.{node.attr}")
    assert not crossing, "private names imported from another module: " + "; ".join(crossing)


def test_seeds_are_derived_from_their_key_alone():
    """:func:`dalign_core.seeding.derived_seed` gives one 63-bit seed per key, the same for the same key."""
    from dalign_core import seeding

    assert seeding.derived_seed("a", 1) != seeding.derived_seed("a", 2)
    assert seeding.derived_seed("a", 1) == seeding.derived_seed("a", 1)
    assert 0 <= seeding.derived_seed("dalign-order", 0, 0) < 2**63

