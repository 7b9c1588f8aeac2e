"""The reproduction environment is declared once: requirements.txt, mirrored by environment.yml.

These tests keep the three places that name packages consistent:
requirements.txt (exact pins), environment.yml (the same pins for conda), and
pyproject.toml (lower bounds, which the pins must satisfy).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*$")


def parse_pins(lines) -> dict[str, str]:
    """``{canonical name: version}`` from ``name==version`` lines; anything else is an error."""
    pins: dict[str, str] = {}
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"not an exact pin (name==version): {raw!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{name} pinned twice"
        pins[name] = match.group(2)
    return pins


@pytest.fixture(scope="module")
def requirements() -> dict[str, str]:
    return parse_pins((ROOT / "requirements.txt").read_text().splitlines())


@pytest.fixture(scope="module")
def conda_env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_requirements_are_exact_pins(requirements):
    assert requirements, "requirements.txt pins nothing"
    for name, version in requirements.items():
        Version(version)  # raises on a malformed version


def test_environment_yml_mirrors_requirements(requirements, conda_env):
    deps = conda_env["dependencies"]
    assert "python=3.11" in deps, "environment.yml should pin python=3.11 like the .venv"
    pip_sections = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    assert parse_pins(pip_sections[0]) == requirements


def _declared_requirements(pyproject) -> list[tuple[str, Requirement]]:
    project = pyproject["project"]
    declared = [("dependencies", Requirement(spec)) for spec in project["dependencies"]]
    for extra, specs in project.get("optional-dependencies", {}).items():
        declared += [(f"optional-dependencies.{extra}", Requirement(spec)) for spec in specs]
    # an extra that names other extras (dalign[hf,vision]) adds no package; one for another Python needs no pin here
    return [(where, req) for where, req in declared
            if canonicalize_name(req.name) != "dalign" and (req.marker is None or req.marker.evaluate())]


def test_runtime_dependencies_are_pinned(requirements, pyproject):
    missing = [
        str(req) for _, req in _declared_requirements(pyproject) if canonicalize_name(req.name) not in requirements
    ]
    assert not missing, f"pyproject.toml names packages that requirements.txt does not pin: {missing}"


def test_pins_satisfy_pyproject_bounds(requirements, pyproject):
    unmet = []
    for where, req in _declared_requirements(pyproject):
        pin = requirements.get(canonicalize_name(req.name))
        if pin is not None and not req.specifier.contains(pin, prereleases=True):
            unmet.append(f"{where}: {req} but requirements.txt pins {pin}")
    assert not unmet, "\n".join(unmet)


def test_core_dependencies_have_lower_bounds(pyproject):
    for spec in pyproject["project"]["dependencies"]:
        req = Requirement(spec)
        assert any(s.operator in (">=", "~=", "==") for s in req.specifier), f"{spec} has no lower bound"


def test_package_metadata(pyproject):
    project = pyproject["project"]
    assert project["name"] == "dalign"
    assert project["scripts"]["dalign"] == "dalign_core.cli:main"
    packages = pyproject["tool"]["setuptools"]["packages"]  # listed (tests/test_packaging.py checks the list)
    assert {"dalign_core", "dalign_repro"} <= set(packages)
    assert all(name.startswith(("dalign_core", "dalign_repro")) for name in packages)
    assert SpecifierSet(project["requires-python"]).contains("3.10")


def test_dalign_core_imports():
    import dalign_core  # noqa: F401


def test_the_book_theme_is_pinned_as_a_consistent_pair(requirements):
    """sphinx-book-theme pins pydata-sphinx-theme exactly, and jupyter-book bounds sphinx-book-theme: one pair."""
    from importlib import metadata

    theme, pydata = requirements.get("sphinx-book-theme"), requirements.get("pydata-sphinx-theme")
    assert theme and pydata, "requirements.txt must pin sphinx-book-theme and pydata-sphinx-theme"
    try:
        installed = metadata.version("sphinx-book-theme")
    except metadata.PackageNotFoundError:
        pytest.skip("sphinx-book-theme is not installed")
    if installed != theme:
        pytest.skip(f"sphinx-book-theme {installed} is installed, not the pinned {theme} (make setup)")
    wants = [Requirement(r) for r in metadata.requires("sphinx-book-theme") or []]
    for req in wants:
        if canonicalize_name(req.name) == "pydata-sphinx-theme" and not req.marker:
            assert req.specifier.contains(pydata), f"sphinx-book-theme {theme} needs {req}, pinned {pydata}"
    for req in (Requirement(r) for r in metadata.requires("jupyter-book") or []):
        if canonicalize_name(req.name) == "sphinx-book-theme" and not req.marker:
            assert req.specifier.contains(theme), f"jupyter-book needs {req}, pinned {theme}"
