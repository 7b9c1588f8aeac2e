"""How well each predictor ranked the insertion points by the gain growing brought, and the ρ difference.

**Scoring** (:func:`score`). Per model and budget, across its insertion points:

* Spearman's ρ between the signed predictor and the gain, with a Fisher-z interval of
  standard error ``√((1 + ρ²/2)/(n − 3))`` (Bonett and Wright); with n ≤ 3 points the
  interval is [−1, 1];
* ``hit``: whether the point the predictor ranks first has the largest gain;
* ``regret``: the largest gain minus the gain at the predictor's first point (≥ 0).

**ρ difference** (:func:`verdict`), shown beside the decision and not judged: per model
``Δ = ρ(d_align) − ρ(grad_norm)``; over models the mean of Δ with its t interval; above 0
``reproduced``, below 0 ``contradicted``, holding 0 ``inconclusive``; fewer than 2 models
with both correlations ``not run``. A baseline that runs backwards makes Δ favour d_align
without d_align beating chance, which is why the decision reads regrets against random.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import pandas as pd
# scipy.stats is imported by the functions that use it: importing it costs 1.3 s of CPU, paid at start-up by
# every process importing this module (a dry run, a torchrun rank, --print-config) that never uses it.

from dalign_repro.sweep.trend import Verdict
from dalign_core.growth.predicting import SIGN, order, point_rows, two_sided_z

__all__ = ["CLAIM", "RHO_CLAIM", "CALIBRATION", "spearman", "average_ranks", "spearman_interval", "MODEL_KEYS",
           "model_keys", "score", "first_choice", "order", "point_rows", "t_quantile", "t_interval", "summarize",
           "label_for", "verdict"]


CLAIM = "d_align chooses where to grow better than the gradient norm and a random choice"
"""The growth claim the claims table judges (:func:`decision`)."""
RHO_CLAIM = "d_align ranks insertion points better than the gradient-norm baseline"
"""The ρ-difference reading (:func:`verdict`), shown beside the decision."""

CALIBRATION = {"null_reproduced": 0.05, "effect_reproduced": 0.80}
"""What the test suite's simulation of :func:`verdict` at the cpu design's models and insertion points holds it to:
without an effect it says "reproduced" at most ``null_reproduced`` of the time (and "contradicted" as rarely); with
gains that follow d_align about as closely as ρ ≈ 0.5 per model, at least ``effect_reproduced`` of the time."""


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties; ±inf rank at the ends, NaN points are left out); NaN
    with < 2 points or a constant side."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~np.isnan(x) & ~np.isnan(y)
    x, y = x[keep], y[keep]
    if len(x) < 2:
        return math.nan
    (xs, x_codes), (ys, y_codes) = np.unique(x, return_inverse=True), np.unique(y, return_inverse=True)
    if len(xs) == 1 or len(ys) == 1:
        return math.nan
    return float(np.corrcoef(average_ranks(x_codes, len(xs)), average_ranks(y_codes, len(ys)))[0, 1])


def average_ranks(codes: np.ndarray, distinct: int) -> np.ndarray:
    """The average ranks (1-based, ties sharing their mean rank) of values given as ``codes``, each value's position
    among the ``distinct`` sorted distinct values (``np.unique(values, return_inverse=True)[1]``):
    ``scipy.stats.rankdata(values)``'s numbers exactly (half-integers), from counts instead of a sort, so a resample
    of coded rows is ranked in linear time."""
    counts = np.bincount(codes, minlength=distinct)
    return (np.cumsum(counts) - (counts - 1) / 2)[codes]


def spearman_interval(rho: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Fisher-z interval of Spearman's ρ from n points (Bonett-Wright SE); [−1, 1] with n ≤ 3, NaN for NaN ρ."""
    if not math.isfinite(rho):
        return math.nan, math.nan
    if n <= 3:
        return -1.0, 1.0
    r = min(max(rho, -0.999999), 0.999999)
    se = math.sqrt((1 + r * r / 2) / (n - 3))
    z = two_sided_z(confidence)
    return math.tanh(math.atanh(r) - z * se), math.tanh(math.atanh(r) + z * se)


MODEL_KEYS = ("family", "dataset", "depth", "model", "width", "seed")
"""Columns that name one trained model (those present in a table)."""


def model_keys(table: pd.DataFrame) -> list[str]:
    return [k for k in MODEL_KEYS if k in table.columns]


def score(table: pd.DataFrame, names: Sequence[str], confidence: float = 0.95) -> pd.DataFrame:
    """Per model, budget and predictor: ``rho`` with ``rho_lo``/``rho_hi``, ``hit``, ``regret``, ``points``.

    ``table`` has one row per (model, layer, budget_steps) with the predictor columns ``names`` and ``gain``.
    A predictor's first point is the one with the highest signed value (ties: the earlier layer).
    """
    keys = model_keys(table) + ["budget_steps"]
    out = []
    for key, rows in table.groupby(keys, sort=False, dropna=False):
        rows = rows.reset_index(drop=True)
        gain = rows.gain.to_numpy(dtype=float)
        best = float(np.nanmax(gain)) if np.isfinite(gain).any() else math.nan
        for name in names:
            signed = SIGN(name) * rows[name].to_numpy(dtype=float)
            rho = spearman(signed, gain)
            lo, hi = spearman_interval(rho, int((~np.isnan(signed) & ~np.isnan(gain)).sum()), confidence)
            if (~np.isnan(signed)).any() and np.isfinite(gain).any():
                top = first_choice(signed)
                hit, regret = float(gain[top] == best), best - float(gain[top])
            else:
                hit, regret = math.nan, math.nan
            out.append({**dict(zip(keys, key)), "predictor": name, "points": len(rows), "rho": rho,
                        "rho_lo": lo, "rho_hi": hi, "hit": hit, "regret": regret})
    return pd.DataFrame(out)


def first_choice(signed: np.ndarray) -> int:
    """Index of the largest signed predictor value (+inf counts as largest, NaN as smallest; ties: the first)."""
    signed = np.asarray(signed, dtype=float)
    return int(np.argmax(np.where(np.isnan(signed), -np.inf, signed))) if (~np.isnan(signed)).any() else 0


@functools.lru_cache(maxsize=256)
def t_quantile(confidence: float, dof: int) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``dof`` degrees of freedom (cached: the decision's
    calibration simulations ask for the same few thousands of times)."""
    from scipy import stats
    return float(stats.t.ppf(1 - (1 - confidence) / 2, dof))


def t_interval(values, confidence: float) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of the finite ``values`` and its Student-t interval (NaN ends below 2 values)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(confidence, len(values) - 1) * float(values.std(ddof=1)) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def summarize(scores: pd.DataFrame, by: Sequence[str] = ("family", "budget_steps"), confidence: float = 0.95
              ) -> pd.DataFrame:
    """Mean ρ, hit rate and regret per predictor (and ``by``) over models, each with a t interval over models."""
    rows = []
    for key, part in scores.groupby(list(by) + ["predictor"], sort=False):
        row = dict(zip(list(by) + ["predictor"], key), models=int(part.rho.notna().sum()))
        for column in ("rho", "hit", "regret"):
            mean, lo, hi = t_interval(part[column].to_numpy(dtype=float), confidence)
            row.update({column: mean, f"{column}_lo": lo, f"{column}_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def label_for(lo: float, hi: float) -> str:
    """``reproduced`` above 0, ``contradicted`` below 0, ``inconclusive`` holding 0, ``not run`` without one."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "not run"
    return "reproduced" if lo > 0 else "contradicted" if hi < 0 else "inconclusive"


def verdict(scores: pd.DataFrame, budget: int | None = None, family: str | None = None, *,
            predictor: str = "d_align", baseline: str = "grad_norm", confidence: float = 0.95) -> Verdict:
    """Judge "``predictor`` ranks insertion points better than ``baseline``" from :func:`score`'s rows.

    Per model Δ = ρ(predictor) − ρ(baseline); the verdict reads the t interval of the mean Δ over models
    (:func:`label_for`). ``budget`` and ``family`` select rows (None: the largest budget; every family).
    ``slope``/``slope_lo``/``slope_hi`` of the returned :class:`~dalign_repro.sweep.trend.Verdict` hold mean Δ and its
    interval.
    """
    claim = RHO_CLAIM if (predictor, baseline) == ("d_align", "grad_norm") else \
        f"{predictor} ranks insertion points better than {baseline}"
    where = f" ({family})" if family else ""
    if scores.empty:
        return Verdict(claim, "not run", f"{claim}{where}: not run at this profile (no grown model).")
    rows = scores if family is None else scores[scores.family == family]
    if budget is None and len(rows):
        budget = int(rows.budget_steps.max())
    rows = rows[rows.budget_steps == budget]
    keys = [k for k in model_keys(rows)]
    wide = rows.pivot_table(index=keys, columns="predictor", values="rho", dropna=False) if len(rows) else None
    if wide is None or predictor not in wide or baseline not in wide:
        return Verdict(claim, "not run", f"{claim}{where}: not run at this profile (no grown model).")
    delta = (wide[predictor] - wide[baseline]).to_numpy(dtype=float)
    models = int(np.isfinite(delta).sum())
    mean, lo, hi = t_interval(delta, confidence)
    label = label_for(lo, hi) if models >= 2 else "not run"
    if label == "not run":
        return Verdict(claim, "not run", f"{claim}{where}: not run ({models} model(s) with both correlations at "
                                         f"{budget} steps; at least 2 are needed).")
    reading = {"reproduced": f"{predictor} ranks the points by their gain better than {baseline} does",
               "contradicted": f"{baseline} ranks the points by their gain better than {predictor} does",
               "inconclusive": "the interval holds 0: these models cannot tell the two rankings apart"}[label]
    pct = f"{confidence * 100:g}%"
    sentence = (f"{claim}{where}: {label}. Over {models} models grown for {budget} steps, Spearman's ρ between "
                f"{predictor} and the realized held-out gain minus that of {baseline} is {mean:+.2f} on average "
                f"({pct} interval [{lo:+.2f}, {hi:+.2f}]): {reading}.")
    return Verdict(claim, label, sentence, mean, lo, hi)
