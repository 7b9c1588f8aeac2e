#!/usr/bin/env python
"""The two cells that make a chapter run when a reader launches it on Binder or Colab.

A launch button opens ``notebooks/<chapter>.ipynb`` itself, outside the book's build. Two cells make it run there:

1. The chapter's first code cell, :data:`LAUNCH_SOURCE`: when ``dalign_core`` cannot be imported (Colab), it clones
   the project from :data:`REPOSITORY` (the address ``book/_config.yml`` names as ``repository.url``), installs the
   exact pins of its ``requirements.txt`` and the package from the clone, and marks the session as launched. Binder
   builds its image from ``binder/`` (the same pins, the package, the lab data) and marks the session in
   ``binder/start``. Either way ``LAUNCH_PROFILE`` is the profile a launched chapter runs at: ``lab``.
2. Right after the parameters cell, :data:`PROFILE_SOURCE`: a launched chapter runs at ``LAUNCH_PROFILE``; a
   build of the book (``dalign_core`` installed, no ``DALIGN_LAUNCH_PROFILE``: ``scripts/execute_notebooks.py``
   removes it from the kernels' environment) keeps the profile papermill injected.

Both cells are tagged ``remove-cell``: the book's pages do not show them.

Usage::

    python scripts/launch_cell.py --check    # exit 1 naming each notebook whose cells are missing or differ
    python scripts/launch_cell.py --write    # insert or update them in every notebooks/NN_*.ipynb
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LAUNCH_TAG = "dalign-launch"
PROFILE_TAG = "dalign-launch-profile"
VARIABLE = "DALIGN_LAUNCH_PROFILE"


def repository() -> str:
    """The project's public git address, as ``book/_config.yml`` names it (``repository.url``; "" while none)."""
    config = yaml.safe_load((ROOT / "book" / "_config.yml").read_text(encoding="utf-8"))
    return str((config.get("repository") or {}).get("url") or "").strip()


def launch_source(address: str) -> str:
    """The first code cell of every chapter, installing from ``address`` when dalign is missing."""
    return f'''# Launched on Binder or Colab, this chapter installs dalign when it is missing (the repository's exact pins)
# and runs at the classroom profile `lab`. A build of the book (dalign installed) skips this cell's work.
import importlib.util
import os
import subprocess
import sys

REPOSITORY = {address!r}  # the project's public address (book/_config.yml: repository.url)
if importlib.util.find_spec("dalign_core") is None:
    if not REPOSITORY:
        raise SystemExit("dalign is not installed, and this notebook names no repository to install it from: "
                         "clone the project, run `make setup`, and open the notebook from its notebooks/ folder")
    clone = os.path.expanduser("~/dalign")
    if not os.path.isdir(clone):
        subprocess.run(["git", "clone", "--depth", "1", REPOSITORY, clone], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r", os.path.join(clone, "requirements.txt")],
                   check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", clone], check=True)
    sys.path.insert(0, clone)  # the running kernel does not read the new install's path file
    os.environ.setdefault("{VARIABLE}", "lab")
LAUNCH_PROFILE = os.environ.get("{VARIABLE}", "")'''


PROFILE_SOURCE = ("# Launched (see the first cell): the classroom profile; a build of the book keeps its own.\n"
                  "profile = LAUNCH_PROFILE or profile")


def _code(nbformat, source: str, tag: str):
    return nbformat.v4.new_code_cell(source, metadata={"tags": ["remove-cell", tag]})


def _tagged(nb, tag: str) -> list[int]:
    return [i for i, cell in enumerate(nb.cells) if tag in cell.get("metadata", {}).get("tags", [])]


def problems(nb, address: str) -> list[str]:
    """What is missing or different in notebook ``nb`` (an empty list: its launch cells are as they should be)."""
    codes = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    parameters = next((i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])), None)
    found = []
    if not codes or nb.cells[codes[0]].source != launch_source(address):
        found.append("its first code cell is not the launch cell of scripts/launch_cell.py")
    if parameters is None or parameters + 1 >= len(nb.cells) or nb.cells[parameters + 1].source != PROFILE_SOURCE:
        found.append("the cell after its parameters cell does not set the launch profile")
    for index in _tagged(nb, LAUNCH_TAG)[:1] + _tagged(nb, PROFILE_TAG)[:1]:
        if "remove-cell" not in nb.cells[index].metadata.get("tags", []):
            found.append(f"cell {index} is not tagged remove-cell")
    return found


def apply(nb, address: str):
    """Insert (or update) the two launch cells in notebook ``nb``; returns it."""
    import nbformat

    nb.cells = [cell for cell in nb.cells if not ({LAUNCH_TAG, PROFILE_TAG} & set(cell.metadata.get("tags", [])))]
    parameters = next(i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", []))
    nb.cells.insert(parameters + 1, _code(nbformat, PROFILE_SOURCE, PROFILE_TAG))
    first_code = next(i for i, cell in enumerate(nb.cells) if cell.cell_type == "code")
    nb.cells.insert(first_code, _code(nbformat, launch_source(address), LAUNCH_TAG))
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="report notebooks whose launch cells are missing")
    group.add_argument("--write", action="store_true", help="insert or update the launch cells of every notebook")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/NN_*.ipynb")
    args = parser.parse_args(argv)
    import nbformat

    from dalign_core.atomic import atomic_path

    address = repository()
    paths = args.notebooks or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    failed = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        found = problems(nb, address)
        if args.write and found:
            with atomic_path(path) as tmp:
                nbformat.write(apply(nb, address), tmp)
            print(f"{path.name}: launch cells written")
        elif found:
            failed += 1
            print(f"{path.name}: {'; '.join(found)} (python scripts/launch_cell.py --write)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
