"""Shared test set-up: headless plotting, no model-hub access, seeded RNGs, a private results folder."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker, here and in every process a test starts: `make test` runs one worker per core,
    # and a worker with torch's default pool of a thread per core oversubscribes the machine (an OpenMP pool spinning
    # for a core another worker holds made test_pythia's 1,000-step fixture take 90 s instead of 8).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# These (and dalign_core/__init__) load numpy and torch, not matplotlib or huggingface_hub.
from dalign_core.environment import OFFLINE_VARIABLES  # noqa: E402
from dalign_repro.config import REPO_ROOT  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Before anything imports matplotlib or huggingface_hub (which read these once, at import).
# Tests never reach a model hub: whatever they need is made locally or shipped in a package.
# Set here, they also reach subprocesses and notebook kernels.
os.environ.setdefault("MPLBACKEND", "Agg")
for _name in OFFLINE_VARIABLES:
    os.environ.setdefault(_name, "1")


SHARED_FILES = {"test_browser.py": "test_notebooks.py", "test_exercises.py": "test_notebooks.py"}
"""Test files that run on the worker of another file under pytest-xdist: the browser test builds the book from
the chapters that test_notebooks.py executed into the session's ``smoke_chapters`` folder, and the exercises test
reads their glued values there."""

OWN_SCOPE = (
    "tests/test_notebooks.py::test_notebook_runs_at_smoke_profile[07_your_model]",
    "tests/test_distributed_studies.py::test_two_ranks_share_the_models_and_write_the_tables_of_one_process"
    "[interventions-resnet]",
    "tests/test_distributed_studies.py::test_two_ranks_share_the_models_and_write_the_tables_of_one_process"
    "[growth-llama]",
)
"""Tests that xdist may run on another worker than the rest of their file: chapter 7 reads no other chapter's
results, so it runs beside the chapters that share theirs (the browser test waits for it in ``smoke_chapters``);
the two torchrun studies are the suite's longest tests, each a scope of its own so that they run side by side."""

LONGEST_FIRST = (
    "tests/test_growth.py",
    "tests/test_reliability.py",
    "tests/test_benchmarks.py",
    "tests/test_intervention.py",
    "tests/test_interventions.py",
    "tests/test_distributed.py",
    # after about 4 minutes of the scopes above: chapter 5, its single process, has run on the chapters' worker
    "tests/test_distributed_studies.py::test_two_ranks_share_the_models_and_write_the_tables_of_one_process"
    "[interventions-resnet]",
    "tests/test_user_trial.py",
    "tests/test_distributed_studies.py::test_two_ranks_share_the_models_and_write_the_tables_of_one_process"
    "[growth-llama]",
    "tests/test_claims.py",
    "tests/test_pythia.py",
    "tests/test_report.py",
    "tests/test_sweep.py",
)
"""Scopes handed out right after the chapters, longest first (from ``pytest --durations``): started early, none of
them is left running alone at the end of a run on two workers. A scope missing here only starts later. The
interventions' torchrun study waits for chapter 5 (its single process), so it comes once chapter 5 has usually
run."""


def _scheduling_rank(item) -> tuple[int, int]:
    """Collection order: the chapters first (the longest scope), the tests of :data:`OWN_SCOPE` next, then
    :data:`LONGEST_FIRST` in its order, the browser test last (it builds the book from the chapters); the rest keep
    their order between."""
    if item.path.name in SHARED_FILES:
        return 5, 0
    if item.nodeid == OWN_SCOPE[0]:
        return 1, 0
    if item.path.name == "test_notebooks.py":
        return 0, 0
    for index, prefix in enumerate(LONGEST_FIRST):
        if item.nodeid == prefix or item.nodeid.startswith(prefix + "::"):
            return 2, index
    return 3, 0


def pytest_collection_modifyitems(config, items):
    """The chapters first, the longest scopes next and the browser test last (see :func:`_scheduling_rank`); xdist
    hands out scopes in this order, so the worker that takes the chapters starts on them at once and another takes
    chapter 7 and then the long scopes."""
    items.sort(key=_scheduling_rank)  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``make test`` (``-n auto --dist loadfile``): one file per worker at a time, the browser test with the chapters.

    Each file runs on one worker, so its module-scoped fixtures are built once; :data:`SHARED_FILES` joins a
    file to another's worker and :data:`OWN_SCOPE` takes single tests out of theirs. Scopes are handed out in
    collection order (:func:`pytest_collection_modifyitems`), not largest first. Other ``--dist`` modes keep
    pytest-xdist's own scheduler.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False

    class SharedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid in OWN_SCOPE:
                return nodeid
            scope = super()._split_scope(nodeid)
            head, _, name = scope.rpartition("/")
            return f"{head}/{SHARED_FILES[name]}" if name in SHARED_FILES else scope

    return SharedFileScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_stay_in_the_sessions_folder(tmp_path_factory):
    """Point ``TMPDIR`` (and :mod:`tempfile`) at a folder in pytest's own, for this process and every one it starts.

    The processes the tests start make temporary files of their own that they do not remove: torchrun a log folder
    per launch (``torchelastic_*``), Chromium a profile per browser, torch's compiler its cache folder. Here they land
    in the session's folder, which pytest prunes (it keeps the last three), not in the machine's ``/tmp``.
    """
    folder = tmp_path_factory.mktemp("tmp")  # after pytest has placed its own base folder, which stays where it is
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    yield folder
    if saved[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]


@pytest.fixture(scope="session")
def smoke_chapters(tmp_path_factory) -> Path:
    """A folder of notebooks executed at the smoke profile, shared by the session's xdist workers.

    tests/test_notebooks.py puts each notebook here once it ran cleanly, holding the lock of
    :func:`tests.test_notebooks.chapter_lock` while it executes it; tests/test_browser.py builds the book from them
    (waiting on a chapter another worker is executing, and executing whatever is missing itself).
    Under xdist every worker's base folder (``popen-gw<i>``) sits in the session's, where this one is.
    """
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "smoke_chapters"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def chapter_results(smoke_chapters) -> Path:
    """The ``DALIGN_RESULTS`` folder the chapters of tests/test_notebooks.py share, as ``make book`` shares
    ``results/<profile>``: chapters 5 and 8 find the width sweeps of chapters 2 to 4 there instead of running them
    again, and chapter 6 judges what they all wrote (a chapter run alone still runs what it lacks). Beside
    :func:`smoke_chapters`, so that a test on another worker can read a chapter's tables once the chapter is there
    (tests/test_distributed_studies.py compares its ranks with chapter 5's single process)."""
    folder = smoke_chapters.parent / "chapter_results"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return REPO_ROOT


@pytest.fixture(autouse=True)
def _seed_everything():
    """Seed Python's, NumPy's and torch's generators before every test, so tests are repeatable."""
    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:  # pragma: no cover
        pass
    try:
        import torch
    except ImportError:  # pragma: no cover
        pass
    else:
        torch.manual_seed(0)
    yield


@pytest.fixture
def results_root(tmp_path, monkeypatch) -> Path:
    """A fresh ``DALIGN_RESULTS`` folder, so a test's results never land in the repository's results/."""
    root = tmp_path / "results"
    root.mkdir()
    monkeypatch.setenv("DALIGN_RESULTS", str(root))
    return root


@pytest.fixture(scope="session")
def _committed_cpu_claims_table():
    from dalign_repro.claims import table as claims

    return claims.claims_table(REPO_ROOT / "results" / "cpu")


@pytest.fixture
def committed_cpu_claims_table(_committed_cpu_claims_table):
    """The claims table of the committed ``results/cpu``, judged once per worker (its verdicts' simulations take
    tens of seconds); each test gets its own copy to read."""
    return _committed_cpu_claims_table.copy()
