"""The course path of the landing page, generated at build time: ``{course-table}`` and ``{course-plan}``.

``{course-table}`` lists every chapter of ``_toc.yml`` in order with its title (the notebook's first heading), the
one line its directive content gives it (``02_llama_width: width sweep of LLaMA-style decoders ...``), the time to
read it (:func:`dalign_repro.report.timings.reading_minutes`, from the executed chapter's prose and figures), and what it
costs to rerun: at ``lab`` and at ``cpu``, from no checkpoint (:func:`dalign_repro.report.timings.fresh_run`: measured or
labelled projected; "not measured" where neither was recorded). The same numbers fill the rerun boxes, so the
landing page and the chapters cannot disagree.

``{course-plan}`` takes its sessions as YAML in its content::

    - session: "Week 1, session 1"
      chapters: [01_theory]
      exercises: "01: 1, 2"
      in_class: [01_theory]        # run at `lab` in class time (their lab costs are summed)
      note: "..."

and renders a table whose "in class" column sums the ``lab`` cost of the chapters it runs, from the same source.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive

from dalign_repro.report import timings

BOOK = Path(__file__).resolve().parents[1]


def _chapters() -> list[str]:
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))
    found: list[str] = []

    def walk(entries):
        for entry in entries or []:
            if "file" in entry and str(entry["file"]).startswith("chapters/"):
                found.append(Path(entry["file"]).stem)
            walk(entry.get("sections"))
            for part in entry.get("parts", []) or []:
                walk(part.get("chapters"))

    for part in toc.get("parts", []) or []:
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return found


def _notebook(stem: str) -> Path:
    """The executed chapter where it exists (its generated sentences and figures count), else the source."""
    from dalign_repro.config import REPO_ROOT

    for path in (BOOK / "chapters" / f"{stem}.ipynb", BOOK.parent / "notebooks" / f"{stem}.ipynb",
                 REPO_ROOT / "notebooks" / f"{stem}.ipynb"):  # a copy of book/ (the browser test) has no notebooks/
        if path.is_file():
            return path
    raise FileNotFoundError(f"course table: no notebook {stem}.ipynb in book/chapters/ or notebooks/; "
                            "run make notebooks")


def _title(path: Path) -> str:
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


def _cost(stem: str, profile: str) -> str:
    timing = timings.fresh_run(stem, profile)
    return timing.short() if timing else "not measured"


def _text(text: str) -> nodes.paragraph:
    return nodes.paragraph(text=text)


def _table(classes: list[str], header: list[str], rows: list[list], widths: list[int]) -> nodes.table:
    table = nodes.table(classes=classes)
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for title in header:
        row += nodes.entry("", _text(title))
    head += row
    body = nodes.tbody()
    group += body
    for values in rows:
        row = nodes.row()
        for value in values:
            entry = nodes.entry()
            entry += value if isinstance(value, nodes.Node) else _text(str(value))
            row += entry
        body += row
    return table


class CourseTable(Directive):
    """One row per chapter of the book: title, one line, reading time, rerun cost at lab and at cpu."""

    has_content = True

    def run(self):
        lines = yaml.safe_load("\n".join(self.content)) or {}
        rows = []
        for stem in _chapters():
            number = int(stem.split("_")[0])  # the chapters call each other by their file's number
            path = _notebook(stem)
            link = nodes.paragraph()
            ref = nodes.reference("", "", internal=True, refuri=f"chapters/{stem}.html")
            ref += nodes.strong(text=f"{number}. {_title(path)}")
            link += ref
            line = str(lines.get(stem, "")).strip()
            if line:
                link += nodes.Text(f": {line}")
            rows.append([link, f"{timings.reading_minutes(path)} min", _cost(stem, "lab"), _cost(stem, "cpu")])
        return [_table(["dalign-course"], ["Chapter", "Reading", "Rerun at lab", "Rerun at cpu"], rows,
                       [60, 12, 14, 14])]


class CoursePlan(Directive):
    """The sessions of a course: chapters to read, exercises, and what runs at lab in class (its summed cost)."""

    has_content = True

    def run(self):
        sessions = yaml.safe_load("\n".join(self.content)) or []
        chapters = _chapters()
        rows = []
        for session in sessions:
            read = [stem for stem in session.get("chapters", [])]
            unknown = [stem for stem in read + session.get("in_class", []) if stem not in chapters]
            if unknown:
                raise self.error(f"course-plan: {unknown} are not chapters of _toc.yml ({', '.join(chapters)})")
            reading = sum(timings.reading_minutes(_notebook(stem)) for stem in read)
            costs = [timings.fresh_run(stem, "lab") for stem in session.get("in_class", [])]
            runs = ", ".join(f"{int(stem.split('_')[0])} ({timing.short() if timing else 'not measured'})"
                             for stem, timing in zip(session.get("in_class", []), costs))
            total = sum(t.seconds for t in costs if t) if costs and all(costs) else math.nan
            in_class = nodes.paragraph()
            if costs:
                stems = session.get("in_class", [])
                only = stems[0] if len(stems) == 1 else "'" + " ".join(stems) + "'"
                in_class += nodes.literal(text=f"make notebooks PROFILE=lab ONLY={only}")
                in_class += nodes.Text(f": chapter{'s' if len(costs) > 1 else ''} {runs}"
                                       + (f"; {timings.duration(total)} in all"
                                          if len(costs) > 1 and math.isfinite(total) else ""))
            else:
                in_class += nodes.Text("nothing (read the committed cpu results)")
            rows.append([str(session.get("session", "")),
                         ", ".join(str(int(stem.split("_")[0])) for stem in read) + f" ({reading} min reading)",
                         str(session.get("exercises", "")), in_class, str(session.get("note", ""))])
        return [_table(["dalign-plan"], ["Session", "Chapters", "Exercises", "Runs at lab in class", "Goal"], rows,
                       [14, 16, 16, 30, 24])]


def _always_reread(app, env, added, changed, removed):
    """The page with the course reads chapters and timings Sphinx does not track: read it on every build."""
    return [app.config.root_doc] if app.config.root_doc in env.found_docs else []


def setup(app):
    app.connect("env-get-outdated", _always_reread)
    app.add_directive("course-table", CourseTable)
    app.add_directive("course-plan", CoursePlan)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
