"""Every chapter notebook runs end to end at the smoke profile, and the book lists every notebook.

The smoke run executes each ``notebooks/NN_*.ipynb`` the way ``make notebooks``
does (``scripts/execute_notebooks.py``) with ``profile="smoke"`` into pytest's
tmp_path, with ``DALIGN_RESULTS`` pointing at a temporary folder so nothing is
written into the repository's results/.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

from dalign_core.config import PROFILES, REPO_ROOT


def _load_runner():
    """scripts/execute_notebooks.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("execute_notebooks", REPO_ROOT / "scripts" / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner = _load_runner()
NOTEBOOKS = runner.find_notebooks()
IDS = [nb.stem for nb in NOTEBOOKS]
CELL_TIMEOUT_S = 900
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


@pytest.fixture(scope="module")
def kernel() -> str:
    return runner.kernel_name()


def _files_under(folder) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


def _toc_files(node) -> list[str]:
    """Every ``file:`` entry of a jupyter-book _toc.yml, at any depth."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("file", "root") and isinstance(value, str):
                found.append(value)
            else:
                found += _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            found += _toc_files(item)
    return found


def _tagged(nb, tag: str) -> list[int]:
    return [i for i, cell in enumerate(nb.cells) if tag in cell.get("metadata", {}).get("tags", [])]


def test_toc_lists_every_notebook_and_nothing_else():
    toc = yaml.safe_load((REPO_ROOT / "book" / "_toc.yml").read_text())
    chapters = {Path(f).with_suffix("").as_posix() for f in _toc_files(toc) if f.startswith("chapters/")}
    notebooks = {f"chapters/{nb.stem}" for nb in NOTEBOOKS}
    assert notebooks - chapters == set(), f"notebooks missing from book/_toc.yml: {sorted(notebooks - chapters)}"
    assert chapters - notebooks == set(), f"book/_toc.yml lists chapters with no notebook: {sorted(chapters - notebooks)}"


def test_makefile_accepts_exactly_the_library_profiles():
    makefile = (REPO_ROOT / "Makefile").read_text()
    match = re.search(r"^PROFILES\s*:?=\s*(.+)$", makefile, flags=re.MULTILINE)
    assert match, "the Makefile has no `PROFILES := ...` line"
    assert tuple(match.group(1).split()) == PROFILES, (
        f"Makefile PROFILES {match.group(1).split()} differ from dalign_core.config.PROFILES {list(PROFILES)}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_parameters_cell_defines_profile_seed_and_force(path):
    """`make notebooks` overrides profile (and force with FORCE=1); seed is set by hand or from the command line."""
    defaults = runner.parameter_defaults(nbformat.read(path, as_version=4))
    missing = {"profile", "seed", "force"} - set(defaults)
    assert not missing, f"{path.name}: the parameters cell must assign {sorted(missing)}"
    assert defaults["profile"] in PROFILES, f"{path.name}: default profile {defaults['profile']!r} is not one of {PROFILES}"
    assert isinstance(defaults["seed"], int), f"{path.name}: seed must default to an int"
    assert defaults["force"] is False, f"{path.name}: force must default to False (recompute only when asked)"


def test_parameter_defaults_explain_what_is_wrong():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("profile = 'cpu'")])
    with pytest.raises(ValueError, match="no cell is tagged 'parameters'"):
        runner.parameter_defaults(nb)
    nb.cells[0].metadata["tags"] = ["parameters"]
    assert runner.parameter_defaults(nb) == {"profile": "cpu"}
    nb.cells[0].source = "import numpy as np\nseeds: list = [0, 1]\nscale = np.sqrt(2)"
    with pytest.raises(ValueError, match="default of 'scale' must be a literal"):
        runner.parameter_defaults(nb)


def test_force_reaches_the_notebook_and_the_book_shows_one_parameters_cell(tmp_path, kernel):
    source = tmp_path / "nb" / "99_probe.ipynb"
    source.parent.mkdir()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell('profile = "cpu"\nseed = 7\nforce = False', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell('assert (profile, seed, force) == ("smoke", 7, True), (profile, seed, force)'),
    ])
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, source)
    out = runner.execute(source, "smoke", tmp_path / "out", kernel, force=True, cell_timeout_s=120)

    executed = nbformat.read(out, as_version=4)
    original, injected = _tagged(executed, "parameters"), _tagged(executed, "injected-parameters")
    assert len(original) == 1 and injected == [original[0] + 1]
    assert "remove-cell" in executed.cells[original[0]].metadata.tags  # hidden in the book
    assert "remove-cell" not in executed.cells[injected[0]].metadata.tags  # shown: every value this run used
    assert all(f"{name} = " in executed.cells[injected[0]].source for name in ("profile", "seed", "force"))
    assert "remove-cell" not in nbformat.read(source, as_version=4).cells[0].metadata.tags  # source untouched
    assert sorted(p.name for p in out.parent.iterdir()) == [source.name]  # no temporary left
    assert executed.metadata.papermill.input_path == str(source)  # a path, not a copy of the cells


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_at_smoke_profile(path, tmp_path, results_root, monkeypatch, kernel, smoke_chapters):
    from papermill.exceptions import PapermillExecutionError

    # As in `make notebooks`: the inline backend, so plotting cells run exactly as they do for the book.
    monkeypatch.setenv("MPLBACKEND", INLINE_BACKEND)
    repo_smoke = REPO_ROOT / "results" / "smoke"
    before = _files_under(repo_smoke)
    try:
        out = runner.execute(path, "smoke", tmp_path, kernel, force=False, cell_timeout_s=CELL_TIMEOUT_S)
    except PapermillExecutionError as error:
        pytest.fail(f"{path.name} failed in cell {error.exec_count}: {error.ename}: {error.evalue}", pytrace=False)

    executed = nbformat.read(out, as_version=4)
    errors = [
        (index, output.get("ename"), output.get("evalue"))
        for index, cell in enumerate(executed.cells)
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors, f"{path.name} has error outputs: {errors}"
    failed = [
        index for index, cell in enumerate(executed.cells)
        if cell.get("metadata", {}).get("papermill", {}).get("exception")
    ]
    assert not failed, f"{path.name}: cells {failed} raised"
    # Smoke results went to the temporary DALIGN_RESULTS folder, not into the repository.
    assert _files_under(repo_smoke) == before, f"{path.name} wrote into {repo_smoke}; it should honour DALIGN_RESULTS"
    # tests/test_browser.py builds the book from these instead of executing every notebook again.
    shutil.copy2(out, smoke_chapters / out.name)
