"""dalign_repro.report.timings: what a chapter costs to rerun, from the recorded measurements and the provenance."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dalign_repro.report import timings
from dalign_repro.config import REPO_ROOT


def _write(path, rows):
    pd.DataFrame(rows, columns=list(timings.COLUMNS)).to_csv(path, index=False)
    return path


def test_the_committed_timings_are_well_formed():
    table = timings.recorded()
    assert len(table) and set(table.kind) <= set(timings.KINDS)
    assert (table.seconds > 0).all() and table.command.str.len().gt(0).all()
    stems = {p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert set(table.chapter) <= stems, f"timings for chapters that do not exist: {set(table.chapter) - stems}"


def test_a_measurement_is_preferred_to_a_projection(tmp_path):
    path = _write(tmp_path / "t.csv", [
        ["02_x", "cpu", 600, "projected", "experiment", "2026-12-03", "abc", "dry run", ""],
        ["02_x", "cpu", 900, "measured", "chapter", "2026-12-01", "def", "make notebooks", "idle"],
    ])
    found = timings.fresh_run("02_x", "cpu", path)
    assert found.kind == "measured" and found.seconds == 900
    assert found.short() == "15.0 min" and "measured on 2026-12-01" in found.sentence()
    projected = timings.fresh_run("02_x", "cpu", _write(tmp_path / "p.csv", [
        ["02_x", "cpu", 1988, "projected", "experiment", "2026-12-02", "abc", "dry run", ""]]))
    assert projected.short() == "≈ 33.1 min (projected)" and "projected by the dry run" in projected.sentence()
    assert timings.fresh_run("02_x", "lab", path) is None


def test_bad_timings_are_refused(tmp_path):
    path = _write(tmp_path / "t.csv", [["02_x", "cpu", 1, "guessed", "chapter", "", "", "x", ""]])
    with pytest.raises(ValueError, match="guessed"):
        timings.recorded(path)
    (tmp_path / "m.csv").write_text("chapter,seconds\n02_x,1\n")
    with pytest.raises(ValueError, match="missing column"):
        timings.recorded(tmp_path / "m.csv")


def test_loaded_counts_only_checkpoints_made_before_the_run(tmp_path):
    """A model the run's own full-length rate trial (or check) trained and then loaded is not counted."""
    runs = pd.DataFrame(dict(width=[8, 8, 16, 16], seed=[0, 1, 0, 1], lr=[0.1, 0.1, 0.05, 0.05],
                             training_loaded=[True, False, True, False]))
    rates = pd.DataFrame(dict(width=[8, 16, 16], seed=[0, 0, 0], lr=[0.1, 0.05, 0.1], steps=[300, 300, 300]))
    runs.to_csv(tmp_path / "toy_runs.csv", index=False)
    rates.to_csv(tmp_path / "toy_lr.csv", index=False)
    provenance = {"config": {"steps": 300}, "runs": {"table": "toy_runs.csv", "count": 4, "training_loaded": 2}}
    assert timings.loaded_before(provenance, tmp_path) == (0, 4)
    assert timings.loaded_before(provenance) == (2, 4)  # without the tables the provenance's count stands
    short = rates.assign(steps=100)  # short trials: their models are not the runs', so the loads came from before
    short.to_csv(tmp_path / "toy_lr.csv", index=False)
    assert timings.loaded_before(provenance, tmp_path) == (2, 4)
    every = runs.assign(training_loaded=True)  # every model loaded: the trial's was loaded as well
    every.to_csv(tmp_path / "toy_runs.csv", index=False)
    rates.to_csv(tmp_path / "toy_lr.csv", index=False)
    assert timings.loaded_before({**provenance, "runs": {**provenance["runs"], "training_loaded": 4}},
                                 tmp_path) == (4, 4)
    grown = {"families": {"a": {"models": [{"reused_from": {}}, {}]}, "b": {"models": [{}]}}}
    assert timings.loaded_before(grown) == (1, 3)


def test_reading_time_counts_prose_and_figures(tmp_path):
    cells = [{"cell_type": "markdown", "source": "word " * 360 + "$x^2$"},
             {"cell_type": "code", "source": "plt.show()", "outputs": []}]
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    assert timings.reading_minutes(path) == 3  # 361 words at 180 a minute, and one figure
    assert timings.duration(45) == "45 s" and timings.duration(348) == "5.8 min" and timings.duration(7200) == "2.0 h"
