#!/usr/bin/env python
"""Execute the book's notebooks with papermill.

Every ``notebooks/NN_*.ipynb`` (sorted by name) is run with the parameter
``profile=<P>`` and written, executed, to ``book/chapters/<same name>.ipynb``,
which is what ``jupyter-book build book`` renders (the book itself never
executes anything).  An executed notebook is written only once it succeeded,
under a temporary name then renamed, so a failed run never leaves a half-done
chapter in place of a good one.

The experiments skip work whose results already exist for the same config
(``dalign_core`` handles that), so re-executing a notebook is cheap when
nothing changed.  ``--force`` (or ``--force=1|yes|true``) sets ``force=True`` for
notebooks whose parameters cell defines ``force``, which makes the experiments
recompute; ``--force=0|no|false`` or ``--force=`` (empty, as ``make notebooks`` passes
when ``FORCE`` is unset) does not. Any other value is an error.

Papermill injects the run's parameters as a cell after the notebook's own
``parameters`` cell.  Every parameter is injected (the notebook's defaults
with ``profile`` and ``force`` overridden) and the original cell is tagged
``remove-cell``, so the book shows one parameters cell holding the values
that produced the page.

``--set 'seeds=2 steps=300'`` (``make notebooks SET=...``) passes the text as the
``overrides`` parameter of every notebook run, which parses it into its config
(:func:`dalign_repro.config.parse_overrides`: ``Config.for_profile(profile,
**parse_overrides(Config, overrides, seed=seed))``); a config changed that way
writes its results to ``results/<profile>+<hash>/``, never over the profile's.
A notebook without an ``overrides`` parameter cannot take them: that is an error.

A notebook is executed again only when something it depends on changed: its
source, its parameters (profile, seed, force, overrides), the library's code
(``dalign_core/**/*.py``), the pins, this script, or a results table's
provenance (``results/*/*.json``). Otherwise the executed copy in ``book/chapters/``
is kept (``--no-cache`` or ``--force`` executes anyway). The digests are kept in
``book/chapters/.executed.json``.

One profile per book: every executed chapter records the profile and overrides it
ran with (papermill's parameters in its metadata). When the chapters in
``book/chapters/`` were not all executed alike (``make book PROFILE=smoke
ONLY=02_llama_width`` after a cpu build), each chapter that differs from the
rest gets a warning at its top naming its profile and the book's, and the
warning goes again once they agree; ``--refuse-mixed`` (``make book STRICT=1``)
fails instead.

``--jobs N`` (``make notebooks JOBS=N``, 2 by default there: the book's two cores) executes up to N chapters at
once, each in a worker process of its own, in an order that respects what one chapter reads of another's results
(:data:`AFTER`: chapters 5 and 8 after the width sweeps of 2 to 4, chapter 8 after chapter 7's cached model,
chapter 6 after every chapter whose tables it judges), so two chapters never compute the same sweep at once.
Such a chapter's kernel computes on one thread (``OMP_NUM_THREADS=1`` unless set).
Every chapter's line reports its wall time and its CPU time (user + system, of the kernel and what it ran:
a loaded machine stretches the first more than the second).

Kernels log errors only and read no user IPython profile (:func:`quiet_kernel`): no
"Kernel is running over TCP without encryption" warning on the terminal for every chapter. They never see
``DALIGN_LAUNCH_PROFILE`` (a launched session's classroom profile, ``scripts/launch_cell.py``): an executed
chapter runs at the profile given here.

Usage::

    python scripts/execute_notebooks.py --profile cpu
    python scripts/execute_notebooks.py --profile smoke --only 01_theory
    python scripts/execute_notebooks.py --profile cpu --force
    python scripts/execute_notebooks.py --profile cpu --force=0   # what `make notebooks FORCE=0` runs
    python scripts/execute_notebooks.py --profile lab --only 02_llama_width --set 'seeds=3 steps=400'
    python scripts/execute_notebooks.py --profile cpu --jobs 2   # two chapters at a time
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

try:
    from dalign_core.atomic import atomic_path, atomic_write_text
    from dalign_repro.config import PROFILES, REPO_ROOT, SOURCE_ROOT, default_results_dir
except ImportError:  # run with some other interpreter than the venv's
    sys.exit(f"{sys.executable} cannot import dalign_core; run `make notebooks` or use .venv/bin/python")

NOTEBOOKS = REPO_ROOT / "notebooks"
CHAPTERS = REPO_ROOT / "book" / "chapters"
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
FORCE_ON = ("1", "yes", "true")
FORCE_OFF = ("0", "no", "false", "")
OVERRIDES_PARAMETER = "overrides"
CACHE_FILE = ".executed.json"
"""Beside the executed chapters (hidden from the book by _config.yml's ``chapters/.*``): each one's input digest."""
BANNER_TAG = "dalign-mixed-build"
LAUNCH_VARIABLE = "DALIGN_LAUNCH_PROFILE"
"""Set in a launched session (binder/start, a chapter's first cell): the profile a launched chapter runs at."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Set to 1 for a chapter executed beside others (``--jobs`` > 1) where the caller has not set them."""
WIDTH_SWEEPS = ("02_llama_width", "03_pythia_width", "04_resnet_width")
AFTER = {
    "05_interventions": WIDTH_SWEEPS,  # intervenes on the width sweeps' trained models (runs a missing sweep itself)
    "08_growth": WIDTH_SWEEPS + ("07_your_model",),  # grows the sweeps' models and chapter 7's cached one
    "06_claims": ("01_theory", *WIDTH_SWEEPS, "05_interventions", "08_growth", "09_llama_context"),  # judges them
}
"""Chapter -> the chapters whose results (tables, checkpoints, the cached demo model) it reads: with ``--jobs`` > 1
it starts only once those of them in the same run have finished. A chapter left out reads no other's."""


def force_flag(value: str) -> bool:
    """``--force``'s value (``make notebooks FORCE=...``): 1/yes/true force, 0/no/false/empty do not (any case)."""
    word = value.strip().lower()
    if word in FORCE_ON:
        return True
    if word in FORCE_OFF:
        return False
    raise argparse.ArgumentTypeError(
        f"FORCE={value!r} is not understood; use FORCE=1 (or yes, true) to recompute the experiments, "
        "FORCE=0 (or no, false, or leave it empty) to reuse current results"
    )


def find_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The book's notebooks, ``NN_name.ipynb``, sorted by name."""
    return sorted(folder.glob(NOTEBOOK_GLOB))


def kernel_name() -> str:
    """The name of a Jupyter kernel that runs *this* interpreter (the venv's python).

    ipykernel installs a ``python3`` kernelspec into ``sys.prefix`` whose command
    is ``python -m ipykernel_launcher``; jupyter_client replaces a bare
    ``python`` with ``sys.executable``, so papermill started from the venv runs
    the notebook in the venv.  If the ``python3`` spec found first (a user-level
    one takes precedence) names some other interpreter, a ``dalign`` kernelspec
    pinned to ``sys.executable`` is installed into ``sys.prefix`` and used.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    bare = {"python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}"}

    def runs_this_python(name: str) -> bool:
        try:
            spec = KernelSpecManager().get_kernel_spec(name)
        except NoSuchKernel:
            return False
        command = spec.argv[0] if spec.argv else ""
        return command in bare or (Path(command).exists() and Path(command).resolve() == Path(sys.executable).resolve())

    if runs_this_python("python3"):
        return "python3"
    if not runs_this_python("dalign"):
        from ipykernel.kernelspec import install

        install(prefix=sys.prefix, kernel_name="dalign", display_name="Python 3 (dalign)")
        if not runs_this_python("dalign"):
            raise RuntimeError(f"could not register a Jupyter kernel for {sys.executable}")
    return "dalign"


@contextlib.contextmanager
def quiet_kernel():
    """Kernels started inside log errors only, and read no user IPython profile.

    ipykernel warns on the terminal, as every kernel starts, that localhost TCP is not encrypted
    (papermill's kernels listen on 127.0.0.1, for one run). The kernel's own log level comes from its
    IPython profile: inside this block ``$IPYTHONDIR`` names one of ours whose ``ipython_kernel_config.json``
    sets it to ERROR (and no startup file of the user's runs in a chapter). Passing the level as a kernel
    argument through papermill instead makes kernels report a KeyboardInterrupt as they shut down.
    The profile is a temporary folder of its own per block, removed when the block ends: each kernel's history
    database stays its own (``--jobs 2`` runs two at once) and nothing is left in the machine's temporary folder.
    """
    with tempfile.TemporaryDirectory(prefix="dalign-ipython-") as folder:
        config = Path(folder) / "profile_default" / "ipython_kernel_config.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps({"IPKernelApp": {"log_level": 40}}) + "\n")
        saved = {name: os.environ.get(name) for name in ("IPYTHONDIR", LAUNCH_VARIABLE)}
        os.environ["IPYTHONDIR"] = folder
        # A chapter launched on Binder runs at `lab` (scripts/launch_cell.py); one this script executes runs at
        # the profile it is given, also inside such a session (`make notebooks PROFILE=cpu` in Binder's terminal).
        os.environ.pop(LAUNCH_VARIABLE, None)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def parameters_cell(nb):
    """The first cell of notebook ``nb`` tagged ``parameters``; ValueError if there is none."""
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return cell
    raise ValueError("no cell is tagged 'parameters'; tag the code cell that assigns profile, seed and force")


def parameter_defaults(nb) -> dict[str, Any]:
    """``{name: value}`` for every ``name = <literal>`` in the parameters cell of notebook ``nb``.

    Values must be Python literals (papermill overrides them by value); anything else
    raises ValueError naming the assignment.
    """
    defaults: dict[str, Any] = {}
    for node in ast.parse(parameters_cell(nb).source).body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        else:
            continue
        for target in targets:
            if not isinstance(target, ast.Name):
                raise ValueError(f"parameters cell: {ast.unparse(node)!r} must assign plain names")
            try:
                defaults[target.id] = ast.literal_eval(node.value)
            except ValueError:
                raise ValueError(f"parameters cell: the default of {target.id!r} must be a literal "
                                 f"(a number, string, bool, None, list or dict), not {ast.unparse(node.value)!r}") from None
    return defaults


def run_parameters(nb, profile: str, force: bool, overrides: str = "", where: str = "") -> dict[str, Any]:
    """The parameters a run of notebook ``nb`` injects: its defaults with profile, force and overrides set."""
    try:
        parameters = parameter_defaults(nb)
    except (ValueError, SyntaxError) as error:
        raise ValueError(f"{where}: {error}") from None
    parameters["profile"] = profile
    if force and "force" in parameters:
        parameters["force"] = True
    if overrides.strip():
        if OVERRIDES_PARAMETER not in parameters:
            raise ValueError(f"{where}: cannot take SET={overrides!r}: its parameters cell has no "
                             f"{OVERRIDES_PARAMETER!r} string parameter (add `{OVERRIDES_PARAMETER} = \"\"` and pass "
                             f"parse_overrides(Config, {OVERRIDES_PARAMETER}, seed=seed) to Config.for_profile)")
        parameters[OVERRIDES_PARAMETER] = overrides.strip()
    return parameters


def execute(path: Path, profile: str, out_dir: Path, kernel: str, force: bool,
            cell_timeout_s: float | None = None, overrides: str = "") -> Path:
    """Run one notebook with papermill into ``out_dir/<name>``, atomically; return that path.

    ``cell_timeout_s`` bounds each cell (None: no limit). ``overrides`` (``"seeds=2 steps=300"``) is
    passed as the notebook's ``overrides`` parameter; a notebook without one refuses them.
    """
    import nbformat
    import papermill as pm

    nb = nbformat.read(path, as_version=4)
    parameters = run_parameters(nb, profile, force, overrides, where=str(path))
    # Papermill's injected cell, placed right after this one, shows every value the run used.
    parameters_cell(nb).metadata.setdefault("tags", []).append("remove-cell")

    with quiet_kernel():
        executed = pm.execute_notebook(
            nb,
            None,  # written below, once it succeeded
            parameters=parameters,
            kernel_name=kernel,
            cwd=str(path.parent),
            progress_bar=False,
            log_output=False,
            request_save_on_cell_execute=False,
            execution_timeout=cell_timeout_s,
        )
    target = out_dir / path.name
    # Papermill was handed the notebook in memory: record its file, not a copy of its cells.
    executed.metadata.papermill.update(input_path=str(path), output_path=str(target))
    with atomic_path(target) as tmp:
        nbformat.write(executed, tmp)
    return target


# ---------------------------------------------------------------------------
# Executing only what changed


def _digest_files(paths, root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        digest.update(str(path.relative_to(root) if path.is_relative_to(root) else path).encode() + b"\0")
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def code_digest() -> str:
    """The digest of what every chapter runs: both packages' code and profiles (dalign_core and dalign_repro), the
    pins and this script."""
    packages = [Path(__import__(name).__file__).resolve().parent for name in ("dalign_core", "dalign_repro")]
    files = [f for package in packages for pattern in ("*.py", "*.toml") for f in package.rglob(pattern)]
    files.append(Path(__file__).resolve())
    if SOURCE_ROOT is not None:
        files += [SOURCE_ROOT / "requirements.txt", SOURCE_ROOT / "pyproject.toml"]
    return _digest_files(files, packages[0].parent)


def results_digest() -> str:
    """The digest of every results table's provenance (``results/*/*.json``; the partial jobs are not read)."""
    root = default_results_dir("smoke").parent
    return _digest_files(root.glob("*/*.json"), root)


def inputs_digest(path: Path, parameters: dict[str, Any], code: str, results: str) -> str:
    """What notebook ``path`` run with ``parameters`` depends on, as one digest."""
    blob = json.dumps({"notebook": hashlib.sha256(path.read_bytes()).hexdigest(), "parameters": parameters,
                       "code": code, "results": results, "results_root": str(default_results_dir("smoke").parent)},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def read_cache(out_dir: Path) -> dict[str, dict]:
    try:
        return json.loads((out_dir / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def write_cache(out_dir: Path, cache: dict[str, dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / CACHE_FILE, json.dumps(cache, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------
# One profile per book


def chapter_run(nb) -> tuple[str, str] | None:
    """(profile, overrides) an executed chapter ran with, from papermill's record; None if it has none."""
    parameters = nb.metadata.get("papermill", {}).get("parameters") or {}
    if "profile" not in parameters:
        return None
    return str(parameters["profile"]), str(parameters.get(OVERRIDES_PARAMETER) or "").strip()


def describe_run(run: tuple[str, str]) -> str:
    profile, overrides = run
    return f"profile `{profile}`" + (f" with the overrides `{overrides}`" if overrides else "")


def mark_mixed_build(out_dir: Path, preferred: tuple[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """Warn on each chapter of ``out_dir`` that ran otherwise than the rest; return ``{chapter: run}`` of those.

    The book's run is the (profile, overrides) most chapters ran with (ties: ``preferred``, this
    invocation's). Each chapter that differs gets a ``{warning}`` cell under its title saying how it and
    the rest of the book ran; chapters that agree lose any such warning left from an earlier build.
    """
    import nbformat

    names = {path.name for path in find_notebooks(NOTEBOOKS)}
    chapters = {path: nbformat.read(path, as_version=4) for path in sorted(out_dir.glob(NOTEBOOK_GLOB))
                if path.name in names}
    runs = {path: chapter_run(nb) for path, nb in chapters.items()}
    counts = collections.Counter(run for run in runs.values() if run is not None)
    if not counts:
        return {}
    top = max(counts.values())
    leaders = [run for run, count in counts.items() if count == top]
    book_run = preferred if preferred in leaders else sorted(leaders)[0]
    differing: dict[str, tuple[str, str]] = {}
    for path, nb in chapters.items():
        run = runs[path]
        kept = [cell for cell in nb.cells if BANNER_TAG not in cell.get("metadata", {}).get("tags", [])]
        cells = list(kept)
        if run is not None and run != book_run:
            differing[path.stem] = run
            others = ", ".join(f"{describe_run(r)} ({n} chapter{'s' if n > 1 else ''})"
                               for r, n in sorted(counts.items()) if r != run)
            banner = nbformat.v4.new_markdown_cell(
                ":::{warning}\n**Mixed build.** This chapter was executed at "
                f"{describe_run(run)}; the rest of the book at {others}. Its numbers are not comparable with "
                f"the other chapters'. Rebuild with one profile (`make book PROFILE={book_run[0]}`"
                f"{' SET=...' if book_run[1] else ''}) to remove this warning.\n:::",
                metadata={"tags": [BANNER_TAG]})
            title = next((i for i, cell in enumerate(cells) if cell.cell_type == "markdown"), -1)
            cells.insert(title + 1, banner)
        if [c.source for c in cells] != [c.source for c in nb.cells]:
            nb.cells = cells
            with atomic_path(path) as tmp:
                nbformat.write(nb, tmp)
    return differing


# ---------------------------------------------------------------------------
# Executing chapters, one at a time or several at once


class Outcome(NamedTuple):
    """How one chapter's execution went: ``wall_s`` and ``cpu_s`` (user + system of the kernel and what it ran,
    in seconds), and for a failure the error's last line (``summary``) and its full text (``detail``)."""

    ok: bool
    wall_s: float
    cpu_s: float
    summary: str = ""
    detail: str = ""


def _cpu_s(usage) -> float:
    return usage.ru_utime + usage.ru_stime


def execute_timed(path: Path, profile: str, out_dir: Path, kernel: str, force: bool, overrides: str = "") -> Outcome:
    """:func:`execute` in this process, timed. Its CPU time is this process's and that of the children it reaped
    meanwhile (the kernel, which reaps the commands it ran): exact when nothing else runs beside it here."""
    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    started = time.perf_counter()
    try:
        execute(path, profile, out_dir, kernel, force, overrides=overrides)
        ok, summary, detail = True, "", ""
    except Exception as error:  # papermill raises PapermillExecutionError with the cell's traceback
        message = str(error).strip().splitlines()
        ok, summary, detail = False, f"{type(error).__name__}: {message[-1] if message else ''}", str(error)
    wall = time.perf_counter() - started
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(_cpu_s(a) - _cpu_s(b) for a, b in zip(after, before))
    return Outcome(ok, wall, cpu, summary, detail)


def execute_in_worker(path: Path, profile: str, out_dir: Path, kernel: str, force: bool,
                      overrides: str = "") -> Outcome:
    """:func:`execute` in a worker process of its own (this script with ``--worker``), timed: its CPU time is the
    worker's with every process it waited for (the kernel, and what the kernel ran), from ``wait4``."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path), "--profile", profile,
               "--out", str(out_dir), "--kernel", kernel, f"--force={'1' if force else '0'}"]
    if overrides:
        command += ["--set", overrides]
    # Chapters share the cores: a kernel computes on one thread (an experiment's workers do anyway), unless the
    # caller chose otherwise; two kernels of two threads each on two cores lose more to waiting than they gain.
    environment = {**os.environ, **{name: os.environ.get(name, "1") for name in THREAD_VARIABLES}}
    with tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=environment)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        wall = time.perf_counter() - started
        output.seek(0)
        text = output.read().decode("utf-8", "replace").strip()
    if process.returncode == 0:
        return Outcome(True, wall, _cpu_s(usage))
    marked = [line[len(FAILED_MARK):] for line in text.splitlines() if line.startswith(FAILED_MARK)]
    summary = marked[0] if marked else f"the worker exited with status {process.returncode}"
    return Outcome(False, wall, _cpu_s(usage), summary, text.replace(FAILED_MARK, "", 1))


FAILED_MARK = "dalign-worker-failed: "
"""Starts the line on which a worker names its failure (a kernel may print other lines before it)."""


def _worker(args) -> int:
    """``--worker NOTEBOOK``: execute that one notebook (no cache record, no mixed-build marks: the caller keeps
    them); on failure print the error's summary after :data:`FAILED_MARK`, then its full text."""
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    os.environ.setdefault("DALIGN_CACHE", str(REPO_ROOT / ".cache" / "dalign"))
    overrides = " ".join(part.strip() for part in args.overrides if part.strip())
    try:
        execute(args.worker, args.profile, args.out, args.kernel or kernel_name(), args.force, overrides=overrides)
    except Exception as error:
        message = str(error).strip().splitlines()
        print(f"{FAILED_MARK}{type(error).__name__}: {message[-1] if message else ''}\n{error}", flush=True)
        return 1
    return 0


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"JOBS={text!r} must be a whole number of chapters at once, 1 or more "
                                         "(make notebooks JOBS=2)")
    return jobs


def chain_lengths(names: list[str], after: dict[str, tuple[str, ...]] = AFTER) -> dict[str, int]:
    """For each chapter of ``names``: the number of chapters in the longest chain of them that waits on it
    (itself included). Starting the longest chains first keeps two workers busy until the end."""
    waiting = {name: [other for other in names if name in after.get(other, ())] for name in names}
    lengths: dict[str, int] = {}

    def length(name: str, seen: frozenset = frozenset()) -> int:
        if name not in lengths:
            later = [length(other, seen | {name}) for other in waiting[name] if other not in seen]
            lengths[name] = 1 + max(later, default=0)
        return lengths[name]

    for name in names:
        length(name)
    return lengths


def schedule(notebooks: list[Path], jobs: int, start, launch, finish,
             after: dict[str, tuple[str, ...]] = AFTER) -> None:
    """Execute ``notebooks``, up to ``jobs`` at once, each only once the chapters it reads (``after``) among them
    have finished (succeeded or not: a chapter runs what it lacks itself), longest chain first, then by name.

    ``start(path)`` returns the parameters to run it with, or None to pass it by (kept or refused: it counts as
    finished); ``launch(path, parameters)`` executes it and returns an :class:`Outcome`, in a thread of its own
    when ``jobs`` > 1; ``finish(path, parameters, outcome)`` reports it, in this thread.
    """
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    by_name = {path.stem: path for path in notebooks}
    lengths = chain_lengths(list(by_name), after)
    pending = sorted(by_name, key=lambda name: (-lengths[name], name))
    finished: set[str] = set()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        running: dict = {}
        while pending or running:
            ready = [name for name in pending
                     if all(dep in finished or dep not in by_name for dep in after.get(name, ()))]
            if not ready and not running:  # a cycle in `after` (none today): run in order rather than stall
                ready = pending[:1]
            for name in ready[:max(0, jobs - len(running))]:
                pending.remove(name)
                parameters = start(by_name[name])
                if parameters is None:
                    finished.add(name)
                    continue
                if jobs == 1:
                    finish(by_name[name], parameters, launch(by_name[name], parameters))
                    finished.add(name)
                    continue
                running[pool.submit(launch, by_name[name], parameters)] = (name, parameters)
            if running:
                completed, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in completed:
                    name, parameters = running.pop(future)
                    finish(by_name[name], parameters, future.result())
                    finished.add(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, required=True, help=" | ".join(PROFILES))
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this notebook (stem such as 01_theory, or a file name); repeatable")
    parser.add_argument("--force", nargs="?", const="1", default="", type=force_flag, metavar="1|yes|true|0|no|false",
                        help="pass force=True to notebooks that take it, so experiments recompute "
                             "(--force alone or 1/yes/true; 0/no/false/empty: no)")
    parser.add_argument("--set", action="append", default=[], metavar="'FIELD=VALUE ...'", dest="overrides",
                        help="overrides of the profile's config, passed as each notebook's `overrides` parameter "
                             "(make notebooks SET='seeds=2 steps=300'); repeatable. Results go to "
                             "results/<profile>+<hash>/")
    parser.add_argument("--no-cache", action="store_true",
                        help="execute every notebook, even where nothing it depends on changed")
    parser.add_argument("--refuse-mixed", action="store_true",
                        help="fail when the chapters in --out were not all executed at one profile and overrides "
                             "(default: warn on each chapter that differs)")
    parser.add_argument("--out", type=Path, default=CHAPTERS, help="where executed notebooks go (default: book/chapters)")
    parser.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                        help="execute up to N chapters at once, each in its own worker process, a chapter after the "
                             "chapters whose results it reads (default 1: one after the other, in this process)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # one chapter, for --jobs (execute_in_worker)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(args)
    overrides = " ".join(part.strip() for part in args.overrides if part.strip())

    # The kernel inherits this process's environment. `make` exports MPLBACKEND=Agg for
    # scripts and tests, but under Agg a notebook's figures never reach its outputs;
    # the inline backend captures them (and needs no display).
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    # The chapters keep their data cache (tokenizers, the corpus, chapter 7's trained model) in the repository, as
    # `make` sets it, also when this script runs on its own (the library alone uses the user's cache folder).
    os.environ.setdefault("DALIGN_CACHE", str(REPO_ROOT / ".cache" / "dalign"))
    notebooks = find_notebooks(NOTEBOOKS)
    if args.only:
        wanted = {Path(name).stem for name in args.only}
        unknown = wanted - {nb.stem for nb in notebooks}
        if unknown:
            parser.error(f"no notebook named {', '.join(sorted(unknown))} in {NOTEBOOKS}; "
                         f"have: {', '.join(nb.stem for nb in notebooks) or 'none'}")
        notebooks = [nb for nb in notebooks if nb.stem in wanted]
    if not notebooks:
        print(f"no notebooks matching {NOTEBOOK_GLOB} in {NOTEBOOKS}; nothing to do")
        return 0

    import nbformat

    # One chapter needs no worker beside it: it runs in this process, as with --jobs 1.
    args.jobs = min(args.jobs, len(notebooks))
    kernel = kernel_name()
    with_overrides = f" and overrides {overrides!r}" if overrides else ""
    print(f"executing {len(notebooks)} notebook(s) with profile={args.profile}{with_overrides} "
          f"(kernel {kernel}, {sys.executable})", flush=True)
    failures: list[tuple[str, str]] = []
    total = time.perf_counter()
    code = code_digest()
    cache = read_cache(args.out)
    done: dict[str, dict[str, Any]] = {}  # name -> parameters of every chapter now current in args.out
    skipped = 0
    shown_out = args.out.relative_to(REPO_ROOT) if args.out.is_relative_to(REPO_ROOT) else args.out
    cpu_total = 0.0

    def start(path: Path) -> dict[str, Any] | None:
        """The parameters to execute ``path`` with, or None when it is kept (unchanged) or refused (bad parameters).
        Decided as the chapter starts, once the chapters it reads have run (their results are in the digest)."""
        nonlocal skipped
        try:
            parameters = run_parameters(nbformat.read(path, as_version=4), args.profile, args.force, overrides,
                                        where=str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT)
                                        else str(path))
        except ValueError as error:
            print(f"-> {path.name}: FAILED: {error}", flush=True)
            failures.append((path.name, str(error)))
            return None
        recorded = cache.get(path.name, {})
        if (not args.no_cache and not args.force and (args.out / path.name).is_file()
                and recorded.get("inputs") == inputs_digest(path, parameters, code, results_digest())):
            print(f"-> {path.name}: unchanged since it was executed (notebook, parameters, library and results); "
                  "kept (--no-cache executes it anyway)", flush=True)
            done[path.name] = parameters
            skipped += 1
            return None
        print(f"-> {path.name} ...", flush=True)
        return parameters

    def finish(path: Path, parameters: dict[str, Any], outcome: Outcome) -> None:
        nonlocal cpu_total
        cpu_total += outcome.cpu_s
        who = f"   {path.stem}:" if args.jobs > 1 else "  "
        if outcome.ok:
            done[path.name] = parameters
            print(f"{who} ok in {outcome.wall_s:.1f} s (CPU {outcome.cpu_s:.1f} s) -> {shown_out}/{path.name}",
                  flush=True)
        else:
            print(f"{who} FAILED after {outcome.wall_s:.1f} s (CPU {outcome.cpu_s:.1f} s): {outcome.summary}",
                  flush=True)
            print(outcome.detail, file=sys.stderr, flush=True)
            failures.append((path.name, outcome.summary.split(": ", 1)[-1]))

    def launch(path: Path, parameters: dict[str, Any]) -> Outcome:
        if args.jobs > 1:
            return execute_in_worker(path, args.profile, args.out, kernel, args.force, overrides)
        return execute_timed(path, args.profile, args.out, kernel, args.force, overrides)

    schedule(notebooks, args.jobs, start, launch, finish)
    # The digests of what each chapter depended on, taken once every chapter ran (a later chapter's results
    # must not make an earlier one look stale).
    results = results_digest()
    for name, parameters in done.items():
        cache[name] = {"inputs": inputs_digest(NOTEBOOKS / name, parameters, code, results),
                       "profile": args.profile, OVERRIDES_PARAMETER: overrides}
    for name, _ in failures:
        cache.pop(name, None)
    if done:
        write_cache(args.out, cache)
    kept = f" ({skipped} unchanged, kept)" if skipped else ""
    at_once = f", up to {args.jobs} at once" if args.jobs > 1 else ""
    print(f"done in {time.perf_counter() - total:.1f} s (CPU {cpu_total:.1f} s{at_once}): "
          f"{len(notebooks) - len(failures)} ok{kept}, {len(failures)} failed")
    differing = mark_mixed_build(args.out, preferred=(args.profile, overrides))
    if differing:
        listing = "; ".join(f"{name}: {describe_run(run)}" for name, run in sorted(differing.items()))
        print(f"{'error' if args.refuse_mixed else 'warning'}: the chapters in {args.out} were not all executed "
              f"alike; these differ from the rest: {listing}"
              + ("" if args.refuse_mixed else " (each says so at its top)"),
              file=sys.stderr, flush=True)
        if args.refuse_mixed:
            return 1
    if failures:
        for name, summary in failures:
            print(f"FAILED: {name}: {summary}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
