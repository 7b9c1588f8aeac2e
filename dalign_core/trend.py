"""Does a quantity rise with width? Spearman trends with a seed bootstrap, and verdicts from them.

The paper's claims are monotone in width: d_align rises with N, the misalignment
probability falls. For one checkpoint (or one matched-loss level, or one budget) we
have, per width, one value per seed. The trend is Spearman's rank correlation ρ
between width and the seed-mean value (ranks, so it asks for monotonicity, not
linearity). Its uncertainty comes from the seeds: each width's seed mean is redrawn
from its small-sample (Student-t) sampling law, ρ is recomputed, and the percentile
interval of those draws is reported. With W widths ρ takes few values (±1, ±0.8, …
for W = 4), so the interval is coarse; it is honest about how little 3 seeds at 4
widths can say, and one seed per width gives no interval at all.

A verdict reads a set of trends (say, every checkpoint of the last third of
training) and says, from the data alone:

* ``reproduced``      the interval lies on the claimed side of 0 at every one;
* ``partly``          at some but not all;
* ``not reproduced``  at none;
* ``not run``         there is nothing to judge at this profile.

The sentence that goes with it is generated here too, so a chapter never types a
comparison with the paper by hand.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["TREND_COLUMNS", "spearman", "width_trend", "Verdict", "verdict"]

TREND_COLUMNS = ("n_widths", "n_seeds", "rho", "rho_lo", "rho_hi", "p_positive", "widths", "means")
"""The columns :func:`width_trend` adds to each group key."""


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    rx = pd.Series(np.asarray(x, dtype=float)).rank().to_numpy()
    ry = pd.Series(np.asarray(y, dtype=float)).rank().to_numpy()
    if len(rx) < 2 or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _bootstrap_rho(widths: np.ndarray, per_width: list[np.ndarray], resamples: int,
                   rng: np.random.Generator) -> np.ndarray:
    """ρ for ``resamples`` draws of the per-width seed means, shape (resamples,).

    Each width's mean is drawn as ``mean + s / sqrt(n) * T`` with ``T`` Student-t with
    ``n - 1`` degrees of freedom (``s`` the seeds' standard deviation): a bootstrap of
    the mean that keeps the small-sample width of a t interval. Resampling the seeds
    themselves would be far too narrow at 3 seeds (with no trend at all, its 95%
    interval excluded 0 in about a quarter of tables).
    """
    means = np.empty((resamples, len(widths)))
    for column, values in enumerate(per_width):
        spread = values.std(ddof=1) / np.sqrt(len(values))
        means[:, column] = values.mean() + spread * rng.standard_t(len(values) - 1, size=resamples)
    width_ranks = pd.Series(widths).rank().to_numpy()
    mean_ranks = pd.DataFrame(means).rank(axis=1).to_numpy()
    wc = width_ranks - width_ranks.mean()
    mc = mean_ranks - mean_ranks.mean(axis=1, keepdims=True)
    denominator = np.sqrt((wc**2).sum() * (mc**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (mc @ wc) / denominator  # NaN where a draw's means are all tied


def width_trend(
    table: pd.DataFrame,
    value: str,
    by: Sequence[str],
    *,
    width: str = "width",
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Spearman ρ of ``width`` against the seed-mean of ``value``, per group of ``by``.

    Args:
        table: tidy rows, one per (group, width, seed); rows with a NaN ``value`` are dropped.
        value: the column to correlate with width (e.g. ``"d_align"``, ``"p_misalign"``).
        by: the group columns (e.g. ``["layer", "pool", "step"]``).
        resamples, confidence, seed: the seed bootstrap.

    Returns:
        One row per group: the ``by`` columns and :data:`TREND_COLUMNS` — ``rho`` on
        the seed means, ``rho_lo``/``rho_hi`` the bootstrap percentile interval,
        ``p_positive`` the fraction of bootstrap draws with ρ > 0, ``widths`` and
        ``means`` as ``"/"``-joined strings. A width with a single seed (a run that
        failed leaves some with one) has no spread to draw its mean from and is left out;
        groups with fewer than 3 widths left get NaN.
    """
    rows = []
    clean = table.dropna(subset=[value])
    for key, group in clean.groupby(list(by), sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        per_width = {w: part[value].to_numpy(dtype=float) for w, part in group.groupby(width, sort=True)}
        per_width = {w: values for w, values in per_width.items() if len(values) >= 2} or per_width
        widths = np.array(sorted(per_width), dtype=float)
        means = np.array([per_width[w].mean() for w in sorted(per_width)])
        row = dict(zip(by, key), n_widths=len(widths), n_seeds=min(len(v) for v in per_width.values()),
                   widths="/".join(f"{w:g}" for w in widths), means="/".join(f"{m:.4g}" for m in means))
        if len(widths) < 3 or row["n_seeds"] < 2:
            row.update(rho=float("nan"), rho_lo=float("nan"), rho_hi=float("nan"), p_positive=float("nan"))
        else:
            rng = np.random.default_rng([seed, len(rows)])
            draws = _bootstrap_rho(widths, [per_width[w] for w in sorted(per_width)], resamples, rng)
            draws = draws[np.isfinite(draws)]
            tail = (1 - confidence) / 2
            row.update(
                rho=spearman(widths, means),
                rho_lo=float(np.quantile(draws, tail)) if len(draws) else float("nan"),
                rho_hi=float(np.quantile(draws, 1 - tail)) if len(draws) else float("nan"),
                p_positive=float((draws > 0).mean()) if len(draws) else float("nan"),
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=[*by, *TREND_COLUMNS])


@dataclass(frozen=True)
class Verdict:
    """A computed verdict on one claim: ``label`` (reproduced / partly / not reproduced / not run) and ``sentence``."""

    claim: str
    label: str
    sentence: str
    holds: int
    reversed: int
    total: int

    def markdown(self) -> str:
        """The sentence for a chapter: the label in bold, math for d_align and (M, K), module names as code."""
        text = self.sentence.replace(self.label, f"**{self.label}**", 1)
        text = re.sub(r"\bat ([A-Za-z_]\w*(?:\.\w+)+) \(", r"at `\1` (", text)
        for plain, typeset in (("d_align", r"$d_{\mathrm{align}}$"), ("(M, K)", "$(M, K)$"),
                               ("heldout pool", "held-out pool")):
            text = text.replace(plain, typeset)
        return text


def verdict(trend: pd.DataFrame, claim: str, *, direction: str = "rises", where: str = "") -> Verdict:
    """Judge ``claim`` from trend rows (one per checkpoint, level or budget).

    ``direction="rises"``: a row holds when its interval lies above 0 (``rho_lo > 0``),
    is reversed when it lies below (``rho_hi < 0``); ``"falls"`` mirrors this. The
    label is ``reproduced`` when every row holds, ``partly`` when some do, ``not
    reproduced`` when none do, ``not run`` when there is no row with a finite ρ.
    ``where`` names the rows in the sentence ("checkpoints in the last third of training").
    """
    if direction not in ("rises", "falls"):
        raise ValueError(f"direction must be 'rises' or 'falls', got {direction!r}")
    rows = trend.dropna(subset=["rho"]) if len(trend) else trend
    total = len(rows)
    if total == 0:
        return Verdict(claim, "not run", f"{claim}: not run at this profile (no trend could be computed).", 0, 0, 0)
    sign = 1 if direction == "rises" else -1
    lower = rows.rho_lo if sign > 0 else -rows.rho_hi
    upper = rows.rho_hi if sign > 0 else -rows.rho_lo
    holds, reverse = int((lower > 0).sum()), int((upper < 0).sum())
    label = "reproduced" if holds == total else "partly" if holds else "not reproduced"
    where = f" {where}" if where else ""
    sentence = (
        f"{claim}: {label}. The 95% interval over seeds of Spearman's ρ between width and the quantity lies "
        f"{'above' if sign > 0 else 'below'} zero at {holds} of {total}{where}"
        f"{f' and on the wrong side at {reverse}' if reverse else ''}; ρ ranges from {rows.rho.min():+.2f} "
        f"to {rows.rho.max():+.2f} (median {rows.rho.median():+.2f})."
    )
    return Verdict(claim, label, sentence, holds, reverse, total)
