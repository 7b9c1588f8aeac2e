"""What a chapter costs to rerun: one source for the rerun boxes, the course table of the book's landing page
and the README.

A chapter's results were often computed partly from the checkpoints of an earlier run, so the wall time in their
provenance is not what a reader pays to recompute them. The cost a reader can trust is that of a run **from no
checkpoint**: measured (a fresh clone, ``make notebooks ONLY=<chapter> PROFILE=<p> FORCE=1``) or projected by the
experiment's ``--dry-run`` (``benchmarks/bench_projection.py``), and labelled as one or the other.

Those costs are recorded, with the date, commit and command that measured them, in ``results/cpu/timings.csv``
(:data:`TIMINGS_FILE`; rows per chapter and profile, the classroom profile ``lab`` included), a tidy table with
the columns of :class:`Timing`, and :func:`fresh_run` reads nothing else, so every reader agrees. The
timing table in the book's appendix "Running at scale" is generated from it (``scripts/timings_table.py``) and checked by ``tests/test_readme.py``.

Nothing here measures: the numbers are the recorded ones. A chapter with no record reads "not measured".
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dalign_repro.config import default_results_dir

__all__ = ["KINDS", "TIMINGS_FILE", "Timing", "duration", "fresh_run", "loaded_before",
           "reading_minutes", "recorded"]

TIMINGS_FILE = default_results_dir("cpu") / "timings.csv"
"""The recorded fresh-run costs (``results/cpu/timings.csv``, committed with the cpu results)."""

KINDS = ("measured", "projected")
"""``measured``: a run from no checkpoint was timed; ``projected``: the experiment's dry run projected it."""

COLUMNS = ("chapter", "profile", "seconds", "kind", "scope", "date", "commit", "command", "note")

WORDS_PER_MINUTE = 180
"""Reading speed for prose with formulas (a textbook's pace, below the 200-250 of plain text)."""
SECONDS_PER_FIGURE = 60
"""Time to read one figure or table against the sentence that follows it."""


@dataclass(frozen=True)
class Timing:
    """One recorded cost of a chapter at a profile.

    Attributes:
        chapter: the notebook's stem (``"04_resnet_width"``); profile: ``"cpu"``, ``"lab"`` ...
        seconds: the wall time in seconds (2 one-thread worker processes on 2 cores, as the book's runs use).
        kind: ``"measured"`` (a run from no checkpoint was timed) or ``"projected"`` (its dry run projected it).
        scope: ``"chapter"`` (``make notebooks``, the whole notebook) or ``"experiment"`` (the experiment alone).
        date: when (ISO date); commit: the commit it ran at; command: the command that was timed or projected.
        note: conditions (an idle machine, other work beside it ...).
    """

    chapter: str
    profile: str
    seconds: float
    kind: str
    scope: str = "chapter"
    date: str = ""
    commit: str = ""
    command: str = ""
    note: str = ""

    @property
    def minutes(self) -> float:
        return self.seconds / 60

    def short(self) -> str:
        """``"31 min"`` or ``"≈ 33 min (projected)"``."""
        text = duration(self.seconds)
        return text if self.kind == "measured" else f"≈ {text} (projected)"

    def sentence(self) -> str:
        """``"30.8 min, measured on 2026-12-02 at d1c0bea (`make ...`)"``, for a rerun box."""
        how = "measured" if self.kind == "measured" else "projected by the dry run"
        when = f" on {self.date}" if self.date else ""
        at = f" at `{self.commit[:7]}`" if self.commit else ""
        command = f" (`{self.command}`)" if self.command else ""
        note = f"; {self.note}" if self.note else ""
        return f"{'' if self.kind == 'measured' else 'about '}{duration(self.seconds)}, {how}{when}{at}{command}{note}"


def duration(seconds: float) -> str:
    """``"45 s"``, ``"5.8 min"``, ``"1.2 h"``: one decimal from a minute on."""
    if not math.isfinite(seconds):
        return "not measured"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def recorded(path: Path | str | None = None) -> pd.DataFrame:
    """The recorded costs (``results/cpu/timings.csv``) as a table with the columns of :class:`Timing`.

    Raises ValueError, naming the file and what is wrong, for a missing column or an unknown ``kind``.
    """
    path = Path(path) if path is not None else TIMINGS_FILE
    if not path.is_file():
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.read_csv(path, dtype={"commit": str, "date": str}, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in table]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; it needs {', '.join(COLUMNS)}")
    unknown = sorted(set(table.kind) - set(KINDS))
    if unknown:
        raise ValueError(f"{path}: kind {unknown} is not one of {', '.join(KINDS)}")
    table["seconds"] = pd.to_numeric(table.seconds, errors="raise")
    return table


def sweep_records(provenance: dict) -> list[dict]:
    """One record per sweep of a width experiment's provenance (``sweeps``: Pythia's depths), else the provenance."""
    return provenance.get("sweeps") or [provenance]


def loaded_before(provenance: dict, folder: Path | str | None = None) -> tuple[int, int]:
    """(models whose training was loaded from a checkpoint that existed before the run, models measured).

    A sweep's ``runs.training_loaded`` also counts models the run itself trained first and then loaded: the first
    seed of a width whose rate trials ran at full length, and the widest width's first seed, which the rate fit's
    full-length check trains. With the sweep's tables in ``folder`` (``<family>_runs.csv`` and ``<family>_lr.csv``),
    a loaded run whose (width, seed, rate) a full-length trial or check row of the same regime holds is not counted,
    unless every model of that regime was loaded (then the trial's model was loaded as well). Without the tables
    the provenance's count stands. Growth and interventions count the models whose rows were taken from an earlier
    run (``reused_from``).
    """
    loaded = measured = 0
    for record in sweep_records(provenance):
        runs = record.get("runs") or {}
        count, found = int(runs.get("count", 0)), int(runs.get("training_loaded", 0))
        measured += count
        if found and folder is not None and runs.get("table"):
            steps = (record.get("config") or provenance.get("config") or {}).get("steps")
            found = _loaded_before_tables(Path(folder), str(runs["table"]), record, steps)
        loaded += found
    for facts in (provenance.get("families") or {}).values():
        models = facts.get("models", []) if isinstance(facts, dict) else []
        measured += len(models)
        loaded += sum(1 for model in models if "reused_from" in model)
    return loaded, measured


def _loaded_before_tables(folder: Path, runs_name: str, record: dict, steps: int | None) -> int:
    try:
        runs = pd.read_csv(folder / runs_name)
        rates = pd.read_csv(folder / runs_name.replace("_runs.csv", "_lr.csv"))
    except (OSError, ValueError):
        return int((record.get("runs") or {}).get("training_loaded", 0))
    for key in ("depth", "dataset", "context"):  # this record's regime (Pythia's depth, ResNet's data set)
        if key in record:
            runs = runs[runs[key] == record[key]] if key in runs else runs
            rates = rates[rates[key] == record[key]] if key in rates else rates
    if "training_loaded" not in runs or not len(runs):
        return 0
    loaded = runs[runs.training_loaded.fillna(False).astype(bool)]
    if len(loaded) == len(runs) or "steps" not in rates or not len(rates):
        return len(loaded)
    full = rates[rates.steps >= (steps if steps else rates.steps.max())]
    trained_here = set(zip(full.width, full.seed, full.lr.round(12)))
    return int(sum((r.width, r.seed, round(r.lr, 12)) not in trained_here for r in loaded.itertuples()))


def fresh_run(chapter: str, profile: str, path: Path | str | None = None) -> Timing | None:
    """What rerunning ``chapter`` at ``profile`` from no checkpoint costs (None: never measured or projected).

    The row of :data:`TIMINGS_FILE` (``path``) for the chapter and profile: the most recent measurement, else the most
    recent projection. Only the recorded rows count, so the rerun boxes, the course table and the README agree; a
    chapter's provenance says what the results shown took, which :func:`loaded_before` qualifies.
    """
    table = recorded(path)
    rows = table[(table.chapter == chapter) & (table.profile == profile)]
    if not len(rows):
        return None
    best = rows.sort_values(["kind", "date"], ascending=[True, False]).iloc[0]  # measured before projected
    return Timing(**{c: best[c] for c in COLUMNS})


def reading_minutes(notebook: Path | str) -> int:
    """Minutes to read a chapter: its prose at :data:`WORDS_PER_MINUTE` and :data:`SECONDS_PER_FIGURE` per figure.

    Counts the words of the markdown cells and of the sentences the code generates (text/markdown outputs of an
    executed copy, when ``notebook`` is one), formulas as one word each, and the figures the code cells draw (in
    the source: ``plt.show()``/``plots.`` calls; executed: image outputs). At least 1.
    """
    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    words, figures = 0, 0
    for cell in cells:
        text = "".join(cell.get("source", ""))
        if cell["cell_type"] == "markdown":
            words += _words(text)
            continue
        outputs = cell.get("outputs", [])
        images = sum(1 for out in outputs if "image/png" in out.get("data", {}))
        figures += images or len(re.findall(r"plt\.show\(\)|^\s*plots\.\w+\(", text, flags=re.MULTILINE))
        for out in outputs:
            words += _words("".join(out.get("data", {}).get("text/markdown", "")))
    return max(1, round(words / WORDS_PER_MINUTE + figures * SECONDS_PER_FIGURE / 60))


def _words(text: str) -> int:
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " x ", text, flags=re.DOTALL)  # a formula reads as one word
    text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    return len(re.findall(r"[A-Za-z0-9][\w'’-]*", text))


LAB_VARIANT_LIMIT_S = 600
"""A lab variant of an exercise must fit a class's 10 minutes (by its chapter's recorded lab cost)."""


def exercise_cost(chapters: str | list[str], lab_variant: str = "", what: str = "it reruns",
                  variant_chapters: str | list[str] | None = None) -> str:
    """The cost line of an exercise that reruns ``chapters`` (stems), as Markdown: their run from no checkpoint at
    ``cpu`` and at ``lab`` (summed, from :func:`fresh_run`), then ``lab_variant`` (a command) with the lab cost it
    stays within (that of ``variant_chapters``, by default ``chapters``), and whether that fits
    :data:`LAB_VARIANT_LIMIT_S`.
    """
    stems = [chapters] if isinstance(chapters, str) else list(chapters)
    parts = []
    for profile in ("cpu", "lab"):
        found = [fresh_run(stem, profile) for stem in stems]
        known = [t for t in found if t is not None]
        if not known:
            parts.append(f"at `{profile}` not measured")
            continue
        total = sum(t.seconds for t in known)
        projected = any(t.kind == "projected" for t in known)
        text = f"{'≈ ' if projected else ''}{duration(total)}{' (projected)' if projected else ''}"
        missing = [stem for stem, t in zip(stems, found) if t is None]
        parts.append(f"at `{profile}` {text}" + (f" plus {', '.join(missing)} (not measured)" if missing else ""))
    line = f"**Cost**: {what} {', '.join(stems)} from no checkpoint: {'; '.join(parts)}."
    if lab_variant:
        variant = stems if variant_chapters is None else (
            [variant_chapters] if isinstance(variant_chapters, str) else list(variant_chapters))
        lab = [fresh_run(stem, "lab") for stem in variant]
        if all(t is not None for t in lab):
            total = sum(t.seconds for t in lab)
            fits = "fits a class's 10 minutes" if total <= LAB_VARIANT_LIMIT_S else "does not fit 10 minutes"
            line += (f" **In class**: `{lab_variant}` trains no more than its lab run, {duration(total)}: "
                     f"it {fits}.")
        else:
            line += f" **In class**: `{lab_variant}` (its lab cost is not measured)."
    return line
