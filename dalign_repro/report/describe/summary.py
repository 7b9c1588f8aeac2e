"""A plain-text summary of every width sweep in a results folder
(``python -m dalign_repro.report.describe results/gpu``).
"""

from __future__ import annotations

import json
from pathlib import Path

from dalign_repro.report.results import read_table
from dalign_repro.report.describe.runs import by_regime, describe_learning_rates, describe_runs, sweep_records
from dalign_repro.report.describe.verdicts import SCALE, at_this_scale, width_verdicts

__all__ = ["REGIME_COLUMNS", "summarize"]


REGIME_COLUMNS = ("depth", "dataset", "context")
"""The columns that tell a family's sibling sweeps apart (Pythia's depth regimes, ResNet's data sets, the context
study's contexts)."""


def summarize(results_dir: str | Path) -> str:
    """A plain-text summary of every width sweep in ``results_dir``: runs, rates and verdicts per regime (for a commit
    message)."""
    results_dir = Path(results_dir)
    lines = []
    for runs_csv in sorted(results_dir.glob("*_runs.csv")):
        family = runs_csv.name[: -len("_runs.csv")]
        runs, provenance = read_table(results_dir, f"{family}_runs")
        tables = {"runs": runs, **{name: read_table(results_dir, f"{family}_{name}")[0]
                                   for name in ("lr", "trend", "misalignment", "geometry")}}
        git = provenance.get("git", {})
        device = ", ".join(sorted({str(s.get("device")) for s in sweep_records(provenance)}))
        lines += [f"== {family} at profile {provenance.get('profile')}: {device}, "
                  f"{provenance.get('wall_time_s', 0) / 60:.1f} min, commit {str(git.get('commit'))[:10]}"
                  f"{' (dirty tree)' if git.get('dirty') else ''}"]
        column = next((c for c in REGIME_COLUMNS if c in tables["runs"]), None)
        regimes = by_regime(tables, column) if column else {None: tables}
        for regime, part in regimes.items():
            runs, misalignment = part["runs"], part["misalignment"]
            if regime is not None:
                lines.append(f"-- {column} {regime}")
            if not runs.empty:
                lines.append(runs[["width", "seed", "lr", "heldout_loss", "baseline_loss", "trained_ok"]].to_string(
                    index=False))
            lines += [describe_runs(runs), describe_learning_rates(part["lr"])]
            layer = misalignment.layer.iloc[0] if not misalignment.empty else ""
            scale = SCALE if len(runs) and at_this_scale(
                family, sorted(runs.width.unique()), depth=regime if column == "depth" else None,
                dataset=regime if column == "dataset" else None) else ""
            lines += ([v.sentence for v in width_verdicts(part["trend"], layer, geometry=part["geometry"],
                                                          family=family, scale=scale, misalignment=misalignment)]
                      if layer else
                      ["No trend: nothing was measured."])
        lines.append("")
    for provenance_json in sorted(results_dir.glob("theory_*.json")):
        record = json.loads(provenance_json.read_text())
        lines.append(f"== {provenance_json.stem}: {record.get('rows')} rows in {record.get('wall_time_s')} s")
    return "\n".join(lines)
