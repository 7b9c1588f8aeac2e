#!/usr/bin/env python
"""The table of what each chapter costs to rerun (book/running_at_scale.md), generated from ``results/cpu/timings.csv``.

The same records fill the rerun box of every chapter and the course table of the book's landing page
(:mod:`dalign_repro.report.timings`), so the three cannot disagree: ``tests/test_readme.py`` fails when the page's block
between ``<!-- timings:start -->`` and ``<!-- timings:end -->`` is not what this script writes.

Usage::

    python scripts/timings_table.py            # rewrite the block in book/running_at_scale.md
    python scripts/timings_table.py --check    # exit 1 (and say so) when it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dalign_repro.report import timings
from dalign_repro.config import REPO_ROOT

PAGE = REPO_ROOT / "book" / "running_at_scale.md"
START, END = "<!-- timings:start -->", "<!-- timings:end -->"


def chapters() -> list[str]:
    """The book's chapters in the order of its table of contents."""
    import yaml

    toc = yaml.safe_load((REPO_ROOT / "book" / "_toc.yml").read_text(encoding="utf-8"))
    return [Path(entry["file"]).stem for entry in toc.get("chapters", []) if str(entry.get("file", "")).startswith(
        "chapters/")]


def _title(stem: str) -> str:
    cells = json.loads((REPO_ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        for line in "".join(cell["source"]).splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return stem


def _cell(timing: timings.Timing | None) -> str:
    if timing is None:
        return "not measured"
    how = "measured" if timing.kind == "measured" else "*projected* by the dry run"
    when = f" {timing.date}" if timing.date else ""
    scope = "" if timing.scope == "chapter" else ", the experiment alone"
    approx = "" if timing.kind == "measured" else "≈ "
    return f"{approx}{timings.duration(timing.seconds)} ({how}{when}{scope}: `{timing.command}`)"


def block() -> str:
    """The Markdown table, between its markers."""
    lines = [START,
             "| chapter | at `lab` | at `cpu`, from no checkpoint |",
             "|---|---|---|"]
    for stem in chapters():
        lines.append(f"| {int(stem.split('_')[0])}. {_title(stem)} (`{stem}`) | "
                     f"{_cell(timings.fresh_run(stem, 'lab'))} | {_cell(timings.fresh_run(stem, 'cpu'))} |")
    lines.append(END)
    return "\n".join(lines)


def current(text: str) -> str | None:
    if START not in text or END not in text:
        return None
    return text[text.index(START):text.index(END) + len(END)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the page's block is current")
    args = parser.parse_args(argv)
    text = PAGE.read_text(encoding="utf-8")
    found, wanted = current(text), block()
    if found is None:
        print(f"error: {PAGE.name} has no {START} ... {END} block; add the two markers where the table goes",
              file=sys.stderr)
        return 1
    if args.check:
        if found != wanted:
            print(f"error: {PAGE.name}'s timing table differs from results/cpu/timings.csv; run "
                  "`python scripts/timings_table.py`", file=sys.stderr)
            return 1
        return 0
    if found != wanted:
        from dalign_core.atomic import atomic_write_text

        atomic_write_text(PAGE, text.replace(found, wanted))
        print(f"{PAGE.name}: timing table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
