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

Usage::

    python scripts/execute_notebooks.py --profile cpu
    python scripts/execute_notebooks.py --profile smoke --only 01_theory
    python scripts/execute_notebooks.py --profile cpu --force
    python scripts/execute_notebooks.py --profile cpu --force=0   # what `make notebooks FORCE=0` runs
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from pathlib import Path
from typing import Any

try:
    from dalign_core.atomic import atomic_path
    from dalign_core.config import PROFILES, REPO_ROOT
except ImportError:  # run with some other interpreter than the venv's
    sys.exit(f"{sys.executable} cannot import dalign_core; run `make notebooks` or use .venv/bin/python")

NOTEBOOKS = REPO_ROOT / "notebooks"
CHAPTERS = REPO_ROOT / "book" / "chapters"
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
FORCE_ON = ("1", "yes", "true")
FORCE_OFF = ("0", "no", "false", "")


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


def execute(path: Path, profile: str, out_dir: Path, kernel: str, force: bool,
            cell_timeout_s: float | None = None) -> Path:
    """Run one notebook with papermill into ``out_dir/<name>``, atomically; return that path.

    ``cell_timeout_s`` bounds each cell (None: no limit).
    """
    import nbformat
    import papermill as pm

    nb = nbformat.read(path, as_version=4)
    try:
        parameters = parameter_defaults(nb)
    except (ValueError, SyntaxError) as error:
        raise ValueError(f"{path}: {error}") from None
    parameters["profile"] = profile
    if force and "force" in parameters:
        parameters["force"] = True
    # Papermill's injected cell, placed right after this one, shows every value the run used.
    parameters_cell(nb).metadata.setdefault("tags", []).append("remove-cell")

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, required=True, help=" | ".join(PROFILES))
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this notebook (stem such as 01_theory, or a file name); repeatable")
    parser.add_argument("--force", nargs="?", const="1", default="", type=force_flag, metavar="1|yes|true|0|no|false",
                        help="pass force=True to notebooks that take it, so experiments recompute "
                             "(--force alone or 1/yes/true; 0/no/false/empty: no)")
    parser.add_argument("--out", type=Path, default=CHAPTERS, help="where executed notebooks go (default: book/chapters)")
    args = parser.parse_args(argv)

    # The kernel inherits this process's environment. `make` exports MPLBACKEND=Agg for
    # scripts and tests, but under Agg a notebook's figures never reach its outputs;
    # the inline backend captures them (and needs no display).
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    notebooks = find_notebooks()
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

    kernel = kernel_name()
    print(f"executing {len(notebooks)} notebook(s) with profile={args.profile} (kernel {kernel}, {sys.executable})",
          flush=True)
    failures: list[tuple[str, str]] = []
    total = time.perf_counter()
    for path in notebooks:
        print(f"-> {path.name} ...", flush=True)
        start = time.perf_counter()
        try:
            execute(path, args.profile, args.out, kernel, args.force)
        except Exception as error:  # papermill raises PapermillExecutionError with the cell's traceback
            elapsed = time.perf_counter() - start
            message = str(error).strip().splitlines()
            summary = message[-1] if message else type(error).__name__
            print(f"   FAILED after {elapsed:.1f} s: {type(error).__name__}: {summary}", flush=True)
            print(str(error), file=sys.stderr, flush=True)
            failures.append((path.name, summary))
            continue
        print(f"   ok in {time.perf_counter() - start:.1f} s -> {args.out.relative_to(REPO_ROOT) if args.out.is_relative_to(REPO_ROOT) else args.out}/{path.name}", flush=True)
    print(f"done in {time.perf_counter() - total:.1f} s: {len(notebooks) - len(failures)} ok, {len(failures)} failed")
    if failures:
        for name, summary in failures:
            print(f"FAILED: {name}: {summary}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
