"""Every chapter notebook runs end to end at the smoke profile, and the book lists every notebook.

The smoke run executes each ``notebooks/NN_*.ipynb`` with papermill and
``profile="smoke"`` into pytest's tmp_path, with ``DALIGN_RESULTS`` pointing at
a temporary folder so nothing is written into the repository's results/.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
PROFILES = ("smoke", "cpu", "paper")
CELL_TIMEOUT_S = 900


def _kernel_name() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from execute_notebooks import kernel_name
    finally:
        sys.path.pop(0)
    return kernel_name()


def _files_under(folder: Path) -> dict[str, int]:
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


def _parameters_cell(path: Path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return cell
    return None


def test_toc_lists_every_notebook_and_nothing_else():
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    chapters = {Path(f).with_suffix("").as_posix() for f in _toc_files(toc) if f.startswith("chapters/")}
    notebooks = {f"chapters/{nb.stem}" for nb in NOTEBOOKS}
    assert notebooks - chapters == set(), f"notebooks missing from book/_toc.yml: {sorted(notebooks - chapters)}"
    assert chapters - notebooks == set(), f"book/_toc.yml lists chapters with no notebook: {sorted(chapters - notebooks)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_parameters_cell_defines_profile(path):
    cell = _parameters_cell(path)
    assert cell is not None, f"{path.name} has no cell tagged 'parameters' (papermill injects profile after it)"
    assert cell.cell_type == "code"
    tree = ast.parse(cell.source)
    values = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and node.value is not None:
                values[target.id] = node.value
    assert "profile" in values, f"{path.name}: the parameters cell must assign `profile`"
    default = ast.literal_eval(values["profile"])
    assert default in PROFILES, f"{path.name}: default profile {default!r} is not one of {PROFILES}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_notebook_runs_at_smoke_profile(path, tmp_path, results_root, monkeypatch):
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    # As in `make notebooks`: the inline backend, so plotting cells run exactly as they do for the book.
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    repo_smoke = ROOT / "results" / "smoke"
    before = _files_under(repo_smoke)
    out = tmp_path / path.name
    try:
        pm.execute_notebook(
            str(path),
            str(out),
            parameters={"profile": "smoke"},
            kernel_name=_kernel_name(),
            cwd=str(path.parent),
            progress_bar=False,
            execution_timeout=CELL_TIMEOUT_S,
            request_save_on_cell_execute=False,
        )
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
