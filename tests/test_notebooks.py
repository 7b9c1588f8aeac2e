"""Every chapter notebook runs end to end at the smoke profile, and the book lists every notebook.

The smoke run executes each ``notebooks/NN_*.ipynb`` the way ``make notebooks``
does (``scripts/execute_notebooks.py``) with ``profile="smoke"`` into pytest's
tmp_path, with ``DALIGN_RESULTS`` pointing at a temporary folder so nothing is
written into the repository's results/.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from dalign_repro.config import PROFILES, REPO_ROOT
from tests.conftest import OWN_SCOPE


def _load_script(name: str):
    """scripts/<name>.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_runner():
    """scripts/execute_notebooks.py as a module."""
    return _load_script("execute_notebooks")


runner = _load_runner()
NOTEBOOKS = runner.find_notebooks()
IDS = [nb.stem for nb in NOTEBOOKS]
CELL_TIMEOUT_S = 900
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


@pytest.fixture(scope="module")
def kernel() -> str:
    return runner.kernel_name()


def chapter_lock(smoke_chapters: Path, stem: str):
    """The lock a worker holds while it executes chapter ``stem`` into ``smoke_chapters`` (a ``filelock.FileLock``):
    tests/test_browser.py takes it before it reads the chapter, so it waits for a chapter another worker executes."""
    from filelock import FileLock

    return FileLock(str(smoke_chapters / f"{stem}.lock"))


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


launch_cell = _load_script("launch_cell")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_a_launched_chapter_installs_dalign_and_runs_at_lab(path):
    """Opened by a launch button (Binder, Colab), the chapter's first code cell installs dalign when it is missing and
    the cell after its parameters selects `lab` (scripts/launch_cell.py --write puts both in place)."""
    nb = nbformat.read(path, as_version=4)
    problems = launch_cell.problems(nb, launch_cell.repository())
    assert not problems, f"{path.name}: {'; '.join(problems)}: run python scripts/launch_cell.py --write"


def test_the_launch_cells_select_lab_only_when_launched(tmp_path, kernel, monkeypatch):
    """A launched session (DALIGN_LAUNCH_PROFILE=lab) runs the chapter at lab; a build of the book, which removes the
    variable from its kernels, keeps the profile it injects."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Probe"), nbformat.v4.new_code_cell(
        'profile = "cpu"\nseed = 0\nforce = False', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("print('profile', profile)")])
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": "Python 3", "language": "python"}
    nb = launch_cell.apply(nb, "")
    assert not launch_cell.problems(nb, "")
    path = tmp_path / "97_launch.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setenv("DALIGN_LAUNCH_PROFILE", "lab")
    out = runner.execute(path, "smoke", tmp_path / "out", kernel, force=False, cell_timeout_s=120)
    printed = "".join(o.get("text", "") for c in nbformat.read(out, as_version=4).cells for o in c.get("outputs", []))
    assert "profile smoke" in printed  # the build's profile, whatever the session says
    from nbclient import NotebookClient

    launched = nbformat.read(path, as_version=4)
    NotebookClient(launched, kernel_name=kernel, timeout=120).execute()  # as Binder runs it: the variable set
    printed = "".join(o.get("text", "") for c in launched.cells for o in c.get("outputs", []))
    assert "profile lab" in printed


def test_the_sidebar_lists_the_chapters_in_their_numeric_order():
    """The chapters call each other by number (the course table prints it): the sidebar runs 1, 2, 3 ..."""
    toc = yaml.safe_load((REPO_ROOT / "book" / "_toc.yml").read_text())
    numbers = [int(Path(f).name[:2]) for f in _toc_files(toc) if f.startswith("chapters/")]
    assert numbers == sorted(numbers), f"book/_toc.yml lists the chapters as {numbers}"


def test_makefile_accepts_exactly_the_library_profiles():
    makefile = (REPO_ROOT / "Makefile").read_text()
    match = re.search(r"^PROFILES\s*:?=\s*(.+)$", makefile, flags=re.MULTILINE)
    assert match, "the Makefile has no `PROFILES := ...` line"
    assert tuple(match.group(1).split()) == PROFILES, (
        f"Makefile PROFILES {match.group(1).split()} differ from dalign_repro.config.PROFILES {list(PROFILES)}")


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
        nbformat.v4.new_code_cell("from ipykernel.kernelapp import IPKernelApp\n"
                                  "print(IPKernelApp.instance().log_level, get_ipython().profile_dir.location)"),
    ])
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, source)
    out = runner.execute(source, "smoke", tmp_path / "out", kernel, force=True, cell_timeout_s=120)
    log_level, profile = nbformat.read(out, as_version=4).cells[-1].outputs[0].text.split()
    # the kernel logged errors only, from a profile of the run's own in the temporary folder, removed afterwards
    assert int(log_level) == logging.ERROR and Path(profile).parent.name.startswith("dalign-ipython-")
    assert Path(profile).parent.parent == Path(tempfile.gettempdir()) and not Path(profile).parent.exists()

    executed = nbformat.read(out, as_version=4)
    original, injected = _tagged(executed, "parameters"), _tagged(executed, "injected-parameters")
    assert len(original) == 1 and injected == [original[0] + 1]
    assert "remove-cell" in executed.cells[original[0]].metadata.tags  # hidden in the book
    assert "remove-cell" not in executed.cells[injected[0]].metadata.tags  # shown: every value this run used
    assert all(f"{name} = " in executed.cells[injected[0]].source for name in ("profile", "seed", "force"))
    assert "remove-cell" not in nbformat.read(source, as_version=4).cells[0].metadata.tags  # source untouched
    assert sorted(p.name for p in out.parent.iterdir()) == [source.name]  # no temporary left
    assert executed.metadata.papermill.input_path == str(source)  # a path, not a copy of the cells


@pytest.mark.slow  # executes a chapter
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_at_smoke_profile(path, tmp_path, results_root, chapter_results, monkeypatch, kernel,
                                        smoke_chapters, request):
    from papermill.exceptions import PapermillExecutionError

    # As in `make notebooks`: the inline backend, so plotting cells run exactly as they do for the book.
    monkeypatch.setenv("MPLBACKEND", INLINE_BACKEND)
    # The chapters share one results folder, as in `make book`; one that xdist may run on another worker
    # (conftest.OWN_SCOPE) keeps its own.
    if request.node.nodeid not in OWN_SCOPE:
        monkeypatch.setenv("DALIGN_RESULTS", str(chapter_results))
    repo_smoke = REPO_ROOT / "results" / "smoke"
    before = _files_under(repo_smoke)
    with chapter_lock(smoke_chapters, path.stem):
        try:
            out = runner.execute(path, "smoke", tmp_path, kernel, force=False, cell_timeout_s=CELL_TIMEOUT_S)
        except PapermillExecutionError as error:
            pytest.fail(f"{path.name} failed in cell {error.exec_count}: {error.ename}: {error.evalue}",
                        pytrace=False)
        _check_executed(path, out, repo_smoke, before)
        # tests/test_browser.py builds the book from these instead of executing every notebook again.
        shutil.copy2(out, smoke_chapters / out.name)


def _check_executed(path: Path, out: Path, repo_smoke: Path, before: dict[str, int]) -> None:
    """The executed chapter ``out`` has no error output and wrote nothing into the repository's results."""
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


# ---------------------------------------------------------------------------
# Overrides (SET=), caching, one profile per book, no TCP warning


def _probe(folder: Path, kernel: str, name: str = "98_probe.ipynb", source: str = "", overrides: bool = True) -> Path:
    """A one-cell notebook with the book's parameters (and an `overrides` one) that prints what it got."""
    folder.mkdir(parents=True, exist_ok=True)
    parameters = 'profile = "cpu"\nseed = 0\nforce = False' + ('\noverrides = ""' if overrides else "")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Probe"),
        nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(source or "print(profile, overrides if 'overrides' in dir() else None)"),
    ])
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / name)
    return folder / name


def test_set_reaches_the_notebook_and_the_config(tmp_path, kernel, results_root, capfd):
    source = _probe(tmp_path / "nb", kernel, source=(
        "from dalign_repro.config import default_results_dir, parse_overrides\n"
        "from dalign_repro.experiments import theory\n"
        "config = theory.Config.for_profile(profile, **parse_overrides(theory.Config, overrides, seed=seed))\n"
        "assert (config.trials, config.dims) == (100, (8, 16)), config\n"
        "print(default_results_dir(config).name)"))
    out = runner.execute(source, "smoke", tmp_path / "out", kernel, force=False, cell_timeout_s=120,
                         overrides="trials=100 dims=[8, 16]")
    executed = nbformat.read(out, as_version=4)
    injected = executed.cells[_tagged(executed, "injected-parameters")[0]].source
    assert "overrides = \"trials=100 dims=[8, 16]\"" in injected  # the book shows the overrides beside the profile
    printed = "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    assert printed.startswith("smoke+") and printed.strip() != "smoke"  # its own results folder
    # The kernel talks over IPC: ipykernel's warning about unencrypted TCP never reaches the terminal.
    assert "without encryption" not in capfd.readouterr().err


def test_set_is_refused_by_a_notebook_without_an_overrides_parameter(tmp_path, kernel):
    source = _probe(tmp_path / "nb", kernel, overrides=False)
    with pytest.raises(ValueError, match="cannot take SET='steps=3'.*no 'overrides' string parameter"):
        runner.execute(source, "smoke", tmp_path / "out", kernel, force=False, overrides="steps=3")


def test_an_unchanged_notebook_is_not_executed_again(tmp_path, kernel, results_root, monkeypatch, capsys):
    folder, out = tmp_path / "nb", tmp_path / "out"
    source = _probe(folder, kernel)
    monkeypatch.setattr(runner, "NOTEBOOKS", folder)
    argv = ["--profile", "smoke", "--out", str(out)]
    assert runner.main(argv) == 0
    first = (out / source.name).stat().st_mtime_ns
    assert source.name in json.loads((out / runner.CACHE_FILE).read_text())
    capsys.readouterr()
    assert runner.main(argv) == 0
    assert "unchanged since it was executed" in capsys.readouterr().out
    assert (out / source.name).stat().st_mtime_ns == first
    assert runner.main(argv + ["--set", "seed=3"]) == 0  # other parameters: executed again
    second = (out / source.name).stat().st_mtime_ns
    assert second != first
    assert runner.main(argv + ["--set", "seed=3", "--no-cache"]) == 0
    assert (out / source.name).stat().st_mtime_ns != second
    (results_root / "smoke").mkdir()
    (results_root / "smoke" / "theory.json").write_text("{}")  # a results table changed: executed again
    third = (out / source.name).stat().st_mtime_ns
    assert runner.main(argv + ["--set", "seed=3"]) == 0
    assert (out / source.name).stat().st_mtime_ns != third


def test_every_chapter_named_in_after_is_a_notebook():
    assert runner.AFTER, "the build's order of chapters is empty"
    for chapter, before in runner.AFTER.items():
        assert {chapter, *before} <= set(IDS), f"{chapter}: {before} names a chapter that does not exist"


def test_chapters_wait_for_the_chapters_whose_results_they_read():
    import threading

    names = ["01_a", "02_sweep", "03_sweep", "05_study", "06_judge", "07_model", "08_grow"]
    after = {"05_study": ("02_sweep", "03_sweep"), "08_grow": ("02_sweep", "07_model"),
             "06_judge": ("01_a", "02_sweep", "03_sweep", "05_study", "08_grow")}
    lock, events, running, most = threading.Lock(), [], set(), [0]

    def launch(path, parameters):
        with lock:
            events.append(("start", path.stem))
            running.add(path.stem)
            most[0] = max(most[0], len(running))
        time.sleep(0.05)
        with lock:
            running.discard(path.stem)
            events.append(("end", path.stem))
        return runner.Outcome(True, 0.05, 0.0)

    finished = []
    runner.schedule([Path(f"{name}.ipynb") for name in names], 2, lambda path: {}, launch,
                    lambda path, parameters, outcome: finished.append(path.stem), after=after)
    assert sorted(finished) == names and most[0] == 2  # each once, two at a time
    order = [name for kind, name in events if kind == "start"]
    ended = [name for kind, name in events if kind == "end"]
    for chapter, before in after.items():
        started_at = events.index(("start", chapter))
        assert all(events.index(("end", dep)) < started_at for dep in before), (chapter, events)
    assert order[-1] == "06_judge" and ended[-1] == "06_judge"
    assert order[:2] == ["02_sweep", "03_sweep"]  # the longest chains first: two chapters wait on each


def test_jobs_execute_chapters_in_workers_with_their_cpu_time(tmp_path, kernel, results_root, monkeypatch, capsys):
    folder, out = tmp_path / "nb", tmp_path / "out"
    _probe(folder, kernel, name="96_probe.ipynb")
    _probe(folder, kernel, name="97_probe.ipynb", source="raise ValueError('the probe fails on purpose')")
    monkeypatch.setattr(runner, "NOTEBOOKS", folder)
    assert runner.main(["--profile", "smoke", "--out", str(out), "--jobs", "2"]) == 1
    printed = capsys.readouterr()
    assert re.search(r"96_probe: ok in [\d.]+ s \(CPU [\d.]+ s\)", printed.out), printed.out
    assert "97_probe: FAILED after" in printed.out and "the probe fails on purpose" in printed.out
    assert "the probe fails on purpose" in printed.err  # the traceback, as a serial run prints it
    assert (out / "96_probe.ipynb").is_file() and not (out / "97_probe.ipynb").exists()
    cache = json.loads((out / runner.CACHE_FILE).read_text())
    assert "96_probe.ipynb" in cache and "97_probe.ipynb" not in cache
    with pytest.raises(SystemExit):
        runner.main(["--profile", "smoke", "--out", str(out), "--jobs", "0"])
    assert "must be a whole number of chapters at once" in capsys.readouterr().err


def _executed_chapter(path: Path, profile: str, overrides: str = "") -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {path.stem}"),
                                         nbformat.v4.new_code_cell("x = 1")])
    nb.metadata["papermill"] = {"parameters": {"profile": profile, "seed": 0, "force": False,
                                               **({"overrides": overrides} if overrides else {})}}
    nbformat.write(nb, path)


def test_a_mixed_build_says_so_on_every_chapter_that_differs(tmp_path, monkeypatch):
    sources, chapters = tmp_path / "notebooks", tmp_path / "chapters"
    sources.mkdir(), chapters.mkdir()
    for name in ("01_a", "02_b", "03_c"):
        (sources / f"{name}.ipynb").write_text("{}")
    monkeypatch.setattr(runner, "NOTEBOOKS", sources)
    _executed_chapter(chapters / "01_a.ipynb", "cpu")
    _executed_chapter(chapters / "02_b.ipynb", "smoke")
    _executed_chapter(chapters / "03_c.ipynb", "cpu", overrides="")
    differing = runner.mark_mixed_build(chapters, preferred=("smoke", ""))
    assert differing == {"02_b": ("smoke", "")}  # the book is at cpu (most chapters), 02 differs
    banner = [c for c in nbformat.read(chapters / "02_b.ipynb", as_version=4).cells
              if runner.BANNER_TAG in c.metadata.get("tags", [])]
    assert len(banner) == 1 and "executed at profile `smoke`" in banner[0].source and "`cpu`" in banner[0].source
    assert nbformat.read(chapters / "02_b.ipynb", as_version=4).cells[1] == banner[0]  # right under the title
    assert not any(runner.BANNER_TAG in c.metadata.get("tags", [])
                   for c in nbformat.read(chapters / "01_a.ipynb", as_version=4).cells)
    # Overrides count as another run; once every chapter agrees, the warnings go.
    _executed_chapter(chapters / "03_c.ipynb", "cpu", overrides="seeds=2")
    assert set(runner.mark_mixed_build(chapters)) == {"02_b", "03_c"}  # a tie: the first run in order is the book's
    for name in ("01_a", "02_b", "03_c"):
        _executed_chapter(chapters / f"{name}.ipynb", "smoke")
    assert runner.mark_mixed_build(chapters) == {}
    assert not any(runner.BANNER_TAG in c.metadata.get("tags", []) for name in ("01_a", "02_b", "03_c")
                   for c in nbformat.read(chapters / f"{name}.ipynb", as_version=4).cells)


def test_refuse_mixed_fails_a_mixed_build(tmp_path, kernel, results_root, monkeypatch, capsys):
    sources, chapters = tmp_path / "notebooks", tmp_path / "chapters"
    _probe(sources, kernel)
    (sources / "97_other.ipynb").write_text("{}")
    chapters.mkdir()
    _executed_chapter(chapters / "97_other.ipynb", "cpu")
    monkeypatch.setattr(runner, "NOTEBOOKS", sources)
    argv = ["--profile", "smoke", "--only", "98_probe", "--out", str(chapters)]
    assert runner.main(argv + ["--refuse-mixed"]) == 1
    assert "error: the chapters" in capsys.readouterr().err
    assert runner.main(argv) == 0  # warns instead, on the chapter that differs
    assert "97_other: profile `cpu`" in capsys.readouterr().err
    assert any(runner.BANNER_TAG in c.metadata.get("tags", [])
               for c in nbformat.read(chapters / "97_other.ipynb", as_version=4).cells)


def test_a_second_build_in_the_same_folder_is_refused(tmp_path):
    """`make book` and `make notebooks` run under scripts/build_lock.py: while one holds the lock, another stops at
    once with a message saying what to do, and runs once the first has finished."""
    import subprocess
    import sys

    from filelock import FileLock

    script = REPO_ROOT / "scripts" / "build_lock.py"
    lock_file = tmp_path / ".build.lock"
    command = [sys.executable, str(script), str(lock_file), "--", sys.executable, "-c", "print('built')"]
    with FileLock(lock_file):
        refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "built" not in refused.stdout
    assert "another `make book` or `make notebooks` is running" in refused.stderr and "wait for it" in refused.stderr
    ran = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == "built"
    failing = subprocess.run([*command[:4], sys.executable, "-c", "raise SystemExit(3)"], capture_output=True,
                             text=True, timeout=60)
    assert failing.returncode == 3  # the command's own status comes back


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_chapter_ends_alike(path):
    """The same closing sections in every chapter: Takeaways, Exercises, Rerun this chapter (in that order)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    sections = [cell.source.splitlines()[0][3:].strip() for cell in nb.cells
                if cell.cell_type == "markdown" and cell.source.startswith("## ")]
    closing = ["Takeaways", "Exercises", "Rerun this chapter"]
    assert sections[-len(closing):] == closing, f"{path.name} ends with {sections[-len(closing):]}, not {closing}"
    takeaways = next((cell.source for cell in nb.cells if cell.source.startswith("## Takeaways")), "")
    assert not re.search(r"\d\.\d|\d%", takeaways), (
        f"{path.name}: the takeaways type a number; say what to conclude, or generate it from the results")
