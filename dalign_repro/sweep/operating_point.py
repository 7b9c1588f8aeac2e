"""The misalignment claim's reference, derived at each design's own operating point, and its calibrated rule.

The paper's width effect is a slope of log d_align on log N (+0.50: 3.9 → 9.5 over N = 512 → 3072). What that
implies for the empirical misalignment rate p̂ depends on where a design sits. With the exact moments,

    Var(μ_Mᵀ g_K) / ‖μ̄‖⁴ = (1/M + 1/K)/d_∥ + 1/(MK·d_2) = r,   B_exact = r / (1 + r),

so each measured cell gives r = B_exact / (1 − B_exact) at its own (M, K), d_∥ and d_2. If d_∥ and d_2 both grow as
N^β (d_align ∝ N^β), r falls as N^−β. A Gaussian approximation of μ_Mᵀ g_K then gives p = Φ(−z) with z = r^−1/2, and

    d logit p / d log N = −(β/2) · z φ(z) / (p (1 − p)):

:func:`implied_logit_slope`, cell by cell; :func:`implied_reference` takes its median over a design's models.
Near p = 1/2 (z small) that is about −0.4·z·β/2, far from the −β that the slope of logit B_align alone would give;
deep in the tail (z = 3) it is steeper. The Gaussian tail is what carries the approximation's error, so the
reference is stated with its derivation and sizes the design, and the label reads the sign:

**The rule** (:func:`misalignment_label`, a claim that p̂ falls): ``reproduced`` when the 95% interval of the slope
of logit p̂ on log N lies below 0, ``contradicted`` when it lies above 0 (misalignment rises with width),
``inconclusive`` otherwise. A true slope of 0 reads ``contradicted`` about 2.5% of the time; the implied effect reads
``reproduced`` with the design's power, at least 80% where its detectable slope is at most the implied one
(:func:`simulate_misalignment_labels` draws synthetic tables from the measured residuals of logit p̂ and applies the
rule; ``tests/test_operating_point.py`` checks both at each committed design). Where the interval excludes the
implied fall but not 0, the sentence says the fall is smaller than the paper's rise implies; it is not a label,
because the implied slope is a model's translation, not a number the paper reports.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
# scipy.stats is imported by the functions that use it: importing it costs 1.3 s of CPU, paid at start-up by
# every process importing this module (a dry run, a torchrun rank, --print-config) that never uses it.

from dalign_repro.sweep.trend import LABELS, PAPER_SLOPE, RUN, detectable_slope

__all__ = ["implied_logit_slope", "implied_reference", "misalignment_label", "logit_residuals",
           "simulate_misalignment_labels", "reference_sentence", "design_detectable"]


def implied_logit_slope(b_exact, d_slope: float = PAPER_SLOPE) -> np.ndarray:
    """Per cell: the slope of logit p on log N implied by d_∥, d_2 ∝ N^``d_slope`` at the cell's B_exact.

    ``b_exact`` (any shape, in (0, 1)): the exact certificate at the cell's (M, K), d_∥ and d_2. Uses the Gaussian
    approximation p = Φ(−z), z = √((1 − B)/B) (see the module docstring). NaN where B is not in (0, 1].
    """
    from scipy import stats
    b = np.asarray(b_exact, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.sqrt((1 - b) / b)
        p = stats.norm.sf(z)
        slope = -(d_slope / 2) * z * stats.norm.pdf(z) / (p * (1 - p))
    return np.where((b > 0) & (b <= 1), slope, np.nan)  # B = 1 (no resolved mean): z = 0, slope 0


def implied_reference(cells: pd.DataFrame, d_slope: float = PAPER_SLOPE) -> dict:
    """The design's reference for the misalignment claim: the median over its cells (one per model at the judged
    (M, K)) of :func:`implied_logit_slope`, with its range and the median B_exact.

    Returns ``slope``, ``lo``/``hi`` (the range over cells), ``b_exact`` (median), ``cells``, ``M``, ``K``; NaN
    without a cell.
    """
    b = cells.b_exact.to_numpy(dtype=float) if len(cells) else np.array([])
    slopes = implied_logit_slope(b, d_slope)
    slopes = slopes[np.isfinite(slopes)]
    if not len(slopes):
        return dict(slope=math.nan, lo=math.nan, hi=math.nan, b_exact=math.nan, cells=0, M=math.nan, K=math.nan)
    return dict(slope=float(np.median(slopes)), lo=float(slopes.min()), hi=float(slopes.max()),
                b_exact=float(np.median(b)), cells=len(slopes), M=int(cells.M.iloc[0]), K=int(cells.K.iloc[0]))


def misalignment_label(lo: float, hi: float) -> str:
    """The rule for "misalignment falls with width": below 0 reproduced, above 0 contradicted, else inconclusive."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "not run"
    return "reproduced" if hi < 0 else "contradicted" if lo > 0 else "inconclusive"


def reference_sentence(reference: dict, lo: float, hi: float, detectable: float) -> str:
    """What the interval says of the implied fall, and whether the design can detect it."""
    implied = reference["slope"]
    if not np.isfinite(implied):
        return ""
    if np.isfinite(detectable) and detectable > abs(implied):
        power = f"this design cannot detect the {implied:+.2f} the paper's rise implies here"
    else:
        power = f"this design can detect the {implied:+.2f} the paper's rise implies here"
    if np.isfinite(lo) and lo > implied:
        return f"{power}; the interval excludes that fall: any fall is smaller than the paper's rise implies"
    return power


def logit_residuals(cells: pd.DataFrame) -> np.ndarray:
    """logit p̂ of each model minus its width's mean, scaled by √(s/(s−1)) for the s seeds of that mean."""
    from dalign_repro.sweep.trend import logit_clip, width_residuals

    summaries = cells.assign(y=logit_clip(cells.p_misalign, cells.trials))[[*RUN, "y"]]
    return width_residuals(summaries)


def simulate_misalignment_labels(widths: Sequence[float], seeds: int, slope: float, residuals: Sequence[float], *,
                                 trials: int = 2000, confidence: float = 0.95, seed: int = 0) -> pd.Series:
    """Share of each label of :func:`misalignment_label` over synthetic tables with ``slope`` built in: each model at
    width N has logit p̂ = ``slope`` · log N plus a residual drawn with replacement from the measured ones."""
    from scipy import stats
    rng = np.random.default_rng(seed)
    x = np.repeat(np.log(np.asarray(widths, dtype=float)), seeds)
    y = slope * x + rng.choice(np.asarray(residuals, dtype=float), size=(trials, len(x)), replace=True)
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    fitted = (y - y.mean(axis=1, keepdims=True)) @ xc / sxx
    residual = y - y.mean(axis=1, keepdims=True) - fitted[:, None] * xc
    df = len(x) - 2
    half = stats.t.ppf(1 - (1 - confidence) / 2, df) * np.sqrt((residual ** 2).sum(axis=1) / df / sxx)
    labels = [misalignment_label(lo, hi) for lo, hi in zip(fitted - half, fitted + half)]
    return pd.Series(labels).value_counts().reindex(list(LABELS), fill_value=0) / trials


def design_detectable(residuals: Sequence[float], widths: Sequence[float], seeds: int,
                      confidence: float = 0.95) -> float:
    """The smallest fall the design detects with 80% power at the residuals' SD (the power calculation of
    :func:`~dalign_repro.sweep.trend.detectable_slope`)."""
    from dalign_repro.sweep.trend import design_se

    sd = float(np.std(np.asarray(residuals, dtype=float), ddof=1))
    se, df = design_se(sd, widths, seeds)
    return detectable_slope(se, df, confidence)
