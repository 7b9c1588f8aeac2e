"""The intervention table's rows as every reading counts them, and how a sentence writes a rate.

The input is ``interventions.csv`` (:mod:`dalign_repro.experiments.interventions`) and,
for the certificates, each family's ``<family>_geometry.csv``. Rates carry Wilson
intervals (:func:`dalign_core.geometry.misalignment.wilson_interval`), so a rate of 0 or 1 still
has an honest width.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dalign_core.geometry.misalignment import wilson_interval
from dalign_repro.report.describe.text import number

__all__ = ["PAPER_RETENTION", "CLOSE_TO_ONE", "SIGN_BANDS", "FIRST_ORDER_TOLERANCE", "Z_BINS", "FAMILY_NAMES",
           "FAILS", "DRAW_COLUMNS", "wilson_rate", "share_with_interval", "column_or", "single_steps",
           "measured_changes", "judged_steps", "percent", "percent_interval", "family_name", "steps_text",
           "model_key", "percentile_interval", "BOOTSTRAP_RESAMPLES", "SETTING_NAMES"]


PAPER_RETENTION = (0.96, 0.99)
CLOSE_TO_ONE = 0.04
"""Below the band, first order within 4 % (the paper's largest departure) at every smaller step."""
SIGN_BANDS = {"reproduced": 0.95, "partly": 0.80}
FIRST_ORDER_TOLERANCE = 0.10
Z_BINS = (0.0, 0.25, 0.5, 1.0, 2.0, math.inf)
"""Edges of |μ_Mᵀg_K| / sd, the statistic's size against its spread over draws."""

FAMILY_NAMES = {"llama": "LLaMA", "pythia": "Pythia", "resnet": "ResNet-20"}
"""How a family is named in a sentence."""

FAILS = {
    "sign": "fails if fewer than 80% of the draws with μ_Mᵀg_K > 0 lower the loss on evaluation examples the step "
            "never saw (what M and K share is then not what fresh examples share)",
    "retention": "fails if, on draws that predict a decrease, the median retention leaves 1 by more than 10% at the "
                 "smallest step (roundoff, kinks of ReLU, or a model that is not smooth there), or never enters 96–99% "
                 "(curvature along the step negative, or the grid steps over the band)",
}
"""What could have made each claim fail, as the claims table and the chapter state it."""

DRAW_COLUMNS = ["family", "model", "width", "seed", "layer", "setting", "kind", "M", "K"]


def wilson_rate(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(share, Wilson low, Wilson high); NaN for no trials."""
    if not trials:
        return math.nan, math.nan, math.nan
    lo, hi = wilson_interval(successes, trials, confidence)
    return successes / trials, lo, hi


def share_with_interval(successes: int, trials: int, confidence: float = 0.95) -> dict:
    share, lo, hi = wilson_rate(successes, trials, confidence)
    return {"agree": share, "agree_lo": lo, "agree_hi": hi, "draws": trials}


def column_or(frame: pd.DataFrame, name: str, default) -> pd.Series:
    return frame[name] if name in frame else pd.Series(default, index=frame.index)


def single_steps(table: pd.DataFrame, step: float | None = None) -> pd.DataFrame:
    """The sign study's single steps (no optimizer steps), at ``train_decrease == step`` when given."""
    if table.empty:
        return table
    sign = table[(table.study == "sign") & (column_or(table, "optimizer_steps", 0) == 0)]
    return sign if step is None else sign[np.isclose(sign.train_decrease, step, rtol=1e-9)]


def measured_changes(frame: pd.DataFrame, on: str) -> tuple[pd.DataFrame, pd.Series, int]:
    """(rows whose sign is measured, their change, ties left out) on ``"eval"`` (E) or ``"heldout"`` (K)."""
    if on == "eval":
        tie = column_or(frame, "eval_tie", False).astype(bool) | column_or(frame, "eval_observed", math.nan).isna()
        kept = frame[~tie]
        return kept, kept.eval_observed, int(tie.sum())
    tie = frame.observed == 0
    kept = frame[~tie]
    return kept, kept.observed, int(tie.sum())


def judged_steps(table: pd.DataFrame, step: float, kind: str) -> pd.DataFrame:
    """The rows a sign verdict reads: the single steps at ``step`` of the insertion ``kind``."""
    rows = single_steps(table, step)
    return rows[rows.kind == kind] if len(rows) else rows


def percent(value: float) -> str:
    return f"{100 * value:.1f}%" if np.isfinite(value) else "—"


def percent_interval(p: float, lo: float, hi: float) -> str:
    return f"{percent(p)} [{percent(lo)}, {percent(hi)}]"


def family_name(family: str) -> str:
    return FAMILY_NAMES.get(family, family)


def steps_text(steps: list[float]) -> str:
    if not steps:
        return ""
    return f"δ = {number(steps[0])}" if len(steps) == 1 else f"δ = {number(steps[0])} to {number(steps[-1])}"


def model_key(frame: pd.DataFrame) -> pd.Series:
    """One label per trained model (draws share its layers and E: the bootstrap's cluster)."""
    parts = [frame.model, frame.seed, column_or(frame, "dataset", "")]
    return pd.Series(["|".join(str(v) for v in values) for values in zip(*parts)], index=frame.index, dtype=object)


def percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    tail = 100 * (1 - confidence) / 2
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


BOOTSTRAP_RESAMPLES = 2000
SETTING_NAMES = {"train/heldout": "train/held-out", "heldout/heldout": "held-out/held-out"}
