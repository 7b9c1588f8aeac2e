"""Packaging: licence, one version, declared imports, the wheel outside the repository, make's FORCE."""

from __future__ import annotations

import ast
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

import dalign_core
from dalign_repro.config import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
# Import names whose distribution is named otherwise.
DISTRIBUTION = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow"}
# Modules that draw the book's figures: they need the `book` extra as a whole.
PLOT_MODULES = {"plots.py", "intervention_plots.py", "figure_style.py"}


def _requirement_name(requirement: str) -> str:
    for stop in "<>=!~;[ ":
        requirement = requirement.split(stop)[0]
    return requirement.strip().lower().replace("_", "-")


def _extra(name: str) -> set[str]:
    """The distributions of extra ``name``, with the extras it names (``dalign[hf,vision]``) expanded."""
    found = set()
    for requirement in PROJECT["optional-dependencies"][name]:
        if _requirement_name(requirement) == "dalign":
            for inner in requirement.split("[", 1)[1].rstrip("]").split(","):
                found |= _extra(inner.strip())
        else:
            found.add(_requirement_name(requirement))
    return found


def _module_level_and_lazy_imports(package: str = "dalign_core") -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Top-level third-party names imported by ``package``: {name: files} at module level and inside functions."""
    stdlib = set(sys.stdlib_module_names)
    eager: dict[str, set[str]] = {}
    lazy: dict[str, set[str]] = {}
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inside = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for node in ast.walk(fn)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in stdlib or top in ("dalign_core", "dalign_repro", "__future__"):
                    continue
                (lazy if id(node) in inside else eager).setdefault(top, set()).add(path.name)
    return eager, lazy


# ---------------------------------------------------------------------------
# Metadata


def test_licence_file_and_metadata():
    text = (REPO_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "the dalign authors" in text
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    assert not any(c.startswith("License ::") for c in PROJECT.get("classifiers", []))  # the expression says it


def test_version_has_one_source():
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dalign_core.__version__"}
    assert isinstance(dalign_core.__version__, str) and dalign_core.__version__.count(".") >= 1


def test_every_package_is_listed():
    """pyproject lists the packages (to map data_manifests/ into the package); a new subpackage must be added."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(REPO_ROOT).parts[:-1]) for package in ("dalign_core", "dalign_repro")
             for p in (REPO_ROOT / package).rglob("__init__.py")}
    assert listed - {"dalign_repro.data_manifests"} == found
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"dalign_repro.data_manifests": "data_manifests"}


def test_every_third_party_import_is_declared_and_optional_ones_are_lazy():
    """The core imports at module level only its requirements (the rest lazily, from an extra); the reproduction
    imports at module level only those and the repro extra (the figures' modules: the plots extra)."""
    required = {_requirement_name(r) for r in PROJECT["dependencies"]}
    optional = set().union(*(_extra(name) for name in PROJECT["optional-dependencies"]))
    for package, allowed in (("dalign_core", required), ("dalign_repro", required | _extra("repro"))):
        eager, lazy = _module_level_and_lazy_imports(package)
        for name, files in {**lazy, **eager}.items():
            dist = DISTRIBUTION.get(name, name).lower().replace("_", "-")
            assert dist in required | optional, f"{name} (imported in {sorted(files)}) is in no dependency or extra"
        for name, files in eager.items():
            dist = DISTRIBUTION.get(name, name).lower().replace("_", "-")
            if dist in _extra("plots") and files <= PLOT_MODULES:  # the book's figures: they need the plots extra
                continue
            assert dist in allowed, f"{package}: {name} is optional but imported at module level in {sorted(files)}"
    eager, lazy = _module_level_and_lazy_imports("dalign_core")
    assert "datasets" in lazy and "datasets" not in eager
    assert any(_requirement_name(r) == "datasets" for r in PROJECT["optional-dependencies"]["hub"])


def test_missing_datasets_says_what_to_install(monkeypatch):
    from dalign_repro.data.text import load_hf_text

    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now raises ImportError
    with pytest.raises(RuntimeError, match="needs the `datasets` package"):
        load_hf_text("some/dataset")


def test_nbval_is_not_a_test_requirement():
    assert not any(_requirement_name(r) == "nbval" for r in PROJECT["optional-dependencies"]["test"])


def test_slow_marker_is_registered(pytestconfig):
    markers = PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers)
    assert "--strict-markers" in PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"]
    assert any(m.startswith("slow:") for m in pytestconfig.getini("markers"))  # what this session's pytest read
    # and it marks something that -m "not slow" deselects: the torchrun tests and the chapters executed at smoke
    import importlib

    for name in ("test_distributed", "test_notebooks"):
        module = importlib.import_module(name)  # tests/ is on sys.path
        marked = [key for key, test in vars(module).items() if key.startswith("test_")
                  and any(mark.name == "slow" for mark in getattr(test, "pytestmark", []))]
        assert marked, f"no test of {name}.py carries the slow mark"


# ---------------------------------------------------------------------------
# Installed outside the repository


def test_source_checkout_is_detected_here():
    from dalign_repro import config
    from dalign_repro.data import manifest

    assert config.SOURCE_ROOT == REPO_ROOT == config.work_root()
    assert REPO_ROOT / "data_manifests" in manifest.manifest_dirs()
    assert manifest.load_manifest("shakespeare").name == "shakespeare"
    with pytest.raises(FileNotFoundError, match="no data manifest named 'nonesuch'.*known: .*shakespeare"):
        manifest.load_manifest("nonesuch")


def test_wheel_installed_outside_the_repository(tmp_path):
    """Build a wheel, install it into a fresh venv, and use it from another folder: manifests and defaults work."""
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info into the tree it builds
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for name in ("dalign_core", "dalign_repro", "data_manifests"):
        shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    run = dict(capture_output=True, text=True, timeout=600, env={**os.environ, "PIP_NO_INPUT": "1"})
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(dist), str(source)], cwd=tmp_path, **run)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("dalign-*.whl")

    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], **run)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # torch and the rest come from this interpreter's environment, read after the new venv's own packages
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  **run).stdout.strip())
    (purelib / "dalign_test_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: never uninstall the dalign this interpreter's environment holds
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed",
                                str(wheel)], **run)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = (
        "import json, dalign_core\n"
        "from dalign_repro import config\n"
        "from dalign_repro.data.manifest import default_cache_dir, load_manifest\n"
        "m = load_manifest('shakespeare')\n"
        "print(json.dumps(dict(package=dalign_core.__file__, source=str(config.SOURCE_ROOT), name=m.name,\n"
        "    sha256=m.sha256, results=str(config.default_results_dir('cpu')), cache=str(default_cache_dir()),\n"
        "    repo_root=str(config.REPO_ROOT), version=dalign_core.__version__)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DALIGN_RESULTS", "DALIGN_CACHE")}
    probed = subprocess.run([str(python), "-c", probe], cwd=elsewhere, capture_output=True, text=True, timeout=300,
                            env=env)
    assert probed.returncode == 0, probed.stderr
    import json

    found = json.loads(probed.stdout.strip().splitlines()[-1])
    assert Path(found["package"]).is_relative_to(venv), found  # the installed copy, not the checkout
    assert found["source"] == "None" and found["name"] == "shakespeare"
    from dalign_repro.data.manifest import load_manifest

    assert found["sha256"] == load_manifest("shakespeare").sha256
    cwd = elsewhere.resolve()
    assert Path(found["results"]) == cwd / "results" / "cpu"
    # The data cache is the user's cache folder, never the working directory (written only where told).
    import platformdirs

    assert Path(found["cache"]) == Path(platformdirs.user_cache_dir("dalign", appauthor=False))
    assert not Path(found["cache"]).is_relative_to(cwd)
    assert Path(found["repo_root"]) == cwd and found["version"] == dalign_core.__version__


# ---------------------------------------------------------------------------
# make notebooks FORCE=...


def _load_runner():
    spec = importlib.util.spec_from_file_location("execute_notebooks", REPO_ROOT / "scripts" / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def runner(monkeypatch):
    """scripts/execute_notebooks.py with the kernel and the execution replaced by a recorder."""
    module = _load_runner()
    calls = []
    monkeypatch.setattr(module, "kernel_name", lambda: "python3")
    monkeypatch.setattr(module, "execute", lambda path, profile, out_dir, kernel, force, *a, **k: calls.append(force))
    monkeypatch.setenv("MPLBACKEND", "Agg")  # main() sets the inline backend for kernels; monkeypatch restores
    module.calls = calls
    return module


def _make_command(force: str | None) -> list[str]:
    """The command `make notebooks` runs (dry run), split as the shell splits it."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    argv = ["make", "-n", "--no-print-directory", "notebooks", "PROFILE=smoke", "ONLY=01_theory"]
    if force is not None:
        argv.append(f"FORCE={force}")
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.replace("\\\n", " ")  # the recipe continues over lines with a backslash
    (line,) = [line for line in printed.splitlines() if "scripts/execute_notebooks.py" in line]
    words = shlex.split(line)
    return words[words.index("scripts/execute_notebooks.py") + 1:]


@pytest.mark.parametrize("value,forced", [
    (None, False), ("", False), ("0", False), ("no", False), ("false", False), ("False", False),
    ("1", True), ("yes", True), ("true", True), ("TRUE", True), ("it's", None),
])
def test_make_notebooks_force_values(runner, capsys, value, forced, tmp_path):
    argv = _make_command(value) + ["--out", str(tmp_path)]  # an empty output folder: nothing cached
    if forced is None:
        with pytest.raises(SystemExit) as exit_:
            runner.main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"FORCE={value!r} is not understood" in err and "FORCE=1 (or yes, true)" in err
        assert "FORCE=0 (or no, false, or leave it empty)" in err and runner.calls == []
    else:
        assert runner.main(argv) == 0
        assert runner.calls == [forced]


def test_bare_force_flag_still_forces(runner):
    assert runner.main(["--profile", "smoke", "--only", "01_theory", "--force"]) == 0
    assert runner.main(["--profile", "smoke", "--only", "01_theory"]) == 0
    assert runner.calls == [True, False]


def test_bad_force_value_from_the_command_line():
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "execute_notebooks.py"), "--profile", "smoke",
                           "--force=maybe"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 2
    assert "FORCE='maybe' is not understood; use FORCE=1 (or yes, true)" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------
# Metadata a user reads: the version, classifiers, URLs, type hints, the extras a module needs


def test_dalign_version_flag(capsys):
    from dalign_core.cli.app import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"dalign {dalign_core.__version__}"


def test_classifiers_urls_and_py_typed_are_declared():
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers and "Intended Audience :: Science/Research" in classifiers
    minimum = PROJECT["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {minimum}" in classifiers
    assert PROJECT["urls"] and all(url.startswith("https://") for url in PROJECT["urls"].values())
    for package in ("dalign_core", "dalign_repro"):
        assert (REPO_ROOT / package / "py.typed").is_file()
        assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"][package]


def test_the_plot_modules_name_the_extra_they_need(monkeypatch):
    import importlib

    extras = PROJECT["optional-dependencies"]
    assert {_requirement_name(r) for r in extras["plots"]} == {"matplotlib", "seaborn"}
    assert {_requirement_name(r) for r in extras["plots"]} <= _extra("book")
    monkeypatch.setitem(sys.modules, "seaborn", None)  # import seaborn now raises ImportError
    monkeypatch.delitem(sys.modules, "dalign_repro.report.plots", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'dalign\[plots\]'"):
        importlib.import_module("dalign_repro.report.plots")
    monkeypatch.delitem(sys.modules, "dalign_repro.report.plots", raising=False)  # the next import loads it afresh


def test_transformers_bound_is_the_first_release_with_dtype(tmp_path, monkeypatch):
    """load_model calls from_pretrained(dtype=...), which transformers has taken since 4.56 (before: torch_dtype).
    No install of the minimum versions is possible offline, so the bound is checked against what the code calls:
    a half-precision checkpoint loads in float32, or in the dtype asked for, through the ``dtype`` keyword."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    declared = {Requirement(r).name: Requirement(r) for r in PROJECT["optional-dependencies"]["hf"]}
    assert not declared["transformers"].specifier.contains(Version("4.55.4"))
    assert declared["transformers"].specifier.contains(Version("4.56.0"))

    transformers = pytest.importorskip("transformers")
    import torch

    from dalign_core.cli.loading import load_model

    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=16)
    transformers.GPT2LMHeadModel(config).half().save_pretrained(tmp_path / "half")
    calls = []
    from_pretrained = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def recording(cls, *args, **kwargs):
        calls.append(kwargs)
        return from_pretrained(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(recording))
    assert {p.dtype for p in load_model(str(tmp_path / "half")).parameters()} == {torch.float32}
    assert {p.dtype for p in load_model(str(tmp_path / "half"), dtype=torch.float64).parameters()} == {torch.float64}
    assert [call.get("dtype") for call in calls] == [torch.float32, torch.float64]
    assert not any("torch_dtype" in call for call in calls)


def test_a_chapter_is_executed_again_when_either_package_changes(monkeypatch):
    """The build's cache key reads both packages' code and the profiles, not only dalign_core's."""
    module = _load_runner()
    read = []
    monkeypatch.setattr(module, "_digest_files", lambda paths, root: read.extend(paths) or "digest")
    module.code_digest()
    names = {path.relative_to(REPO_ROOT).as_posix() for path in read if path.is_relative_to(REPO_ROOT)}
    assert "dalign_core/geometry/bounds.py" in names and "dalign_repro/sweep/run.py" in names
    assert "dalign_repro/experiments/profiles/llama_width.toml" in names and "scripts/execute_notebooks.py" in names
