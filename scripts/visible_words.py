#!/usr/bin/env python
"""Count the words a reader sees in each chapter, outside tables, code and folded blocks (at most about
2,500 a chapter, about 18,000 for the book).

Counts the prose of the markdown cells and the sentences the code writes (``text/markdown`` outputs of cells whose
output shows), leaving out tables (lines starting with ``|``), fenced code, formulas (one word each, as
:func:`dalign_repro.report.timings.reading_minutes` counts them), and folded blocks (``{dropdown}``, admonitions
with ``:class: dropdown``, and cells tagged ``hide-cell``/``hide-output``/``remove-*``). A glued value reads as one
word.

Usage: python scripts/visible_words.py [book/chapters/*.ipynb]   (default: book/chapters/, else notebooks/)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLD = re.compile(r"^(\s*)([`:]{3,})\{(dropdown|toggle|admonition)\}[^\n]*\n(.*?)^\1\2\s*$", re.DOTALL | re.MULTILINE)
HIDDEN = {"hide-cell", "hide-output", "remove-cell", "remove-output"}


def _visible(text: str) -> str:
    def fold(match):
        folded = match.group(3) in ("dropdown", "toggle") or re.search(r"^\s*:class:.*\bdropdown\b",
                                                                        match.group(4)[:200], re.MULTILINE)
        return "" if folded else match.group(4)

    for _ in range(3):  # nested blocks
        text = FOLD.sub(fold, text)
    text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))
    text = re.sub(r"\{glue(?::\w+)?\}`[^`]+`", " x ", text)
    return re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " x ", text, flags=re.DOTALL)


def words(path: Path) -> int:
    """The visible words of notebook ``path`` (an executed chapter counts its generated sentences too)."""
    count = 0
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] == "markdown":
            texts = ["".join(cell["source"])]
        elif tags & HIDDEN:
            continue
        else:
            texts = ["".join(out.get("data", {}).get("text/markdown", "")) for out in cell.get("outputs", [])]
        count += sum(len(re.findall(r"[A-Za-z0-9][\w'’-]*", _visible(text))) for text in texts)
    return count


def main(argv: list[str]) -> int:
    folder = ROOT / "book" / "chapters"
    paths = [Path(a) for a in argv] or sorted(folder.glob("[0-9][0-9]_*.ipynb")) or sorted(
        (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    total = 0
    for path in paths:
        n = words(path)
        total += n
        print(f"{path.stem:20s} {n:6,d}")
    print(f"{'all':20s} {total:6,d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
