"""Does a quantity rise with width? A slope test whose verdict can come out either way.

The paper's width claims are monotone: d_align rises with the width N, the
misalignment probability falls. Its LLaMA numbers set the size of the effect:
d_align goes from 3.9 at N = 512 to 9.5 at N = 3072, a slope of

    β* = log(9.5 / 3.9) / log(3072 / 512) ≈ 0.50

for log d_align on log N (d_align ∝ N^0.5). Through the certificate
B_align = 1 / (1 + n_eff · d_align), that rise moves logit B_align ≈ −log(n_eff d_align)
by −β* per unit of log N: the reference slope of the misalignment claim.

**One number per run.** A single checkpoint's log d_align scatters by a factor of 3
within a width (most of it between checkpoints of one run, not between seeds), so each
run (width, seed) is summarized by the mean of log X over the checkpoints of the last
third of training (:func:`run_summaries`), or by log X interpolated where the run's
smoothed held-out loss first reaches a common level (:func:`matched_loss_summaries`).

**The slope.** Ordinary least squares of the run summaries y on x = log N, seeds as
replicates (runs are independent: every run has its own initialization and data order),

    β̂ = Σ (x − x̄)(y − ȳ) / Σ (x − x̄)²,   SE = s / √Σ (x − x̄)²,   s² = RSS / (n − 2),

and the 95% interval β̂ ± t_{0.975, n−2} SE. A mixed model adds nothing here: with one
summary per run there is no within-run replication left for a seed effect to absorb.

**Labels**, for a claim that X rises (mirrored for "falls", with β* < 0):

* ``reproduced``    the interval lies above 0;
* ``contradicted``  the interval lies below β*: any rise is smaller than the paper's
  (``reversed`` in the sentence when it lies below 0 as well);
* ``inconclusive``  the interval holds both 0 and β*: this design cannot tell;
* ``not run``       nothing to judge.

**Each family's own claim.** The paper gives a number only for LLaMA; for Pythia and ResNet-20 it says
"rises", so those are judged on the sign (``reference = SIGN``: contradicted when the interval lies below 0).

**Matched loss without the clock.** Reading each run where its held-out loss crosses a common level
(:func:`matched_loss_summaries`) mixes width with training time when wider runs get there earlier;
:mod:`dalign_repro.sweep.clock` compares the runs at the same steps instead, and calibrates both readings.

**Not estimable.** Where the interval of ‖μ‖² holds 0 at most checkpoints a verdict reads
(:func:`estimability`), log d_align has no estimate and any slope would be set by the floor under the log:
the label is ``not estimable``. Elsewhere the verdicts leave a d_align of 0 out of its run's mean.

**Power.** Every verdict states the smallest slope the design detects with 80% power
(:func:`detectable_slope`): the δ·SE at which a noncentral t with n − 2 degrees of
freedom and noncentrality δ exceeds t_{0.975} with probability 0.8. The seeds a sweep
needs are chosen the same way before it runs (:func:`seeds_for_power`), from the noise
of earlier runs (:func:`noise_components`). :func:`simulate_labels` draws synthetic
tables at a design and a noise level with a chosen slope built in and applies the
rule: with the paper's slope it must say ``reproduced`` most of the time, with none it
must almost never do so (``tests/test_trend.py`` checks both at each family's design).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
# scipy.stats is imported by the functions that use it: importing it costs 1.3 s of CPU, paid at start-up by
# every process importing this module (a dry run, a torchrun rank, --print-config) that never uses it.

__all__ = ["PAPER_D_ALIGN", "PAPER_SLOPE", "SIGN", "LABELS", "VOCABULARY", "SLOPE_COLUMNS", "log_floor",
           "run_summaries", "matched_loss_summaries", "slope_test", "label_for", "detectable_slope", "power",
           "design_se", "seeds_for_power", "noise_components", "simulate_labels", "estimability", "ESTIMABLE_SHARE",
           "Verdict", "verdict"]

PAPER_D_ALIGN = (3.9, 9.5)
"""The paper's d_align of its trained LLaMA-style models: 3.9 at N = 512, 9.5 at N = 3072."""
PAPER_SLOPE = math.log(PAPER_D_ALIGN[1] / PAPER_D_ALIGN[0]) / math.log(3072 / 512)
"""The paper's LLaMA effect: the slope of log d_align on log width from 3.9 at N = 512 to 9.5 at N = 3072."""

LABELS = ("reproduced", "contradicted", "inconclusive", "not run", "not estimable")
"""The labels a slope test gives (``not estimable``: :func:`estimability`)."""
VOCABULARY = ("reproduced", "partly", "contradicted", "inconclusive", "not run", "not estimable")
"""The one vocabulary of every verdict in the book and the claims table."""

SIGN = 0.0
"""The reference of a claim judged on its sign alone (the paper gives a direction, no number): reproduced when the
interval lies on the claimed side of 0, contradicted when it lies on the other side, inconclusive when it holds 0."""

SLOPE_COLUMNS = ("n_widths", "n_runs", "slope", "slope_lo", "slope_hi", "se", "df", "sigma", "detectable",
                 "reference", "label", "widths", "means")
"""The columns :func:`slope_test` returns, in order."""

FLOOR = 1e-6
"""log X is taken of max(X, FLOOR) in the figures and the sweep's trend table: an estimate of d_align can be 0
(‖μ‖² estimated ≤ 0) and log 0 is −∞. No verdict reads it: the verdicts leave such rows out and say how many
(:func:`run_summaries` with ``drop_zeros``), and a design where they are most of the late checkpoints is
``not estimable`` (:func:`estimability`)."""


def log_floor(values, floor: float | None = None) -> np.ndarray:
    """``log(max(values, floor))`` elementwise (NaN stays NaN); ``floor`` defaults to :data:`FLOOR`."""
    values = np.asarray(values, dtype=float)
    floor = FLOOR if floor is None else floor
    with np.errstate(invalid="ignore"):
        return np.log(np.where(np.isnan(values), np.nan, np.maximum(values, floor)))


def logit_clip(p, trials) -> np.ndarray:
    """logit of a resampled probability, kept off 0 and 1 by half a resample (``0.5 / trials``)."""
    p, trials = np.asarray(p, dtype=float), np.asarray(trials, dtype=float)
    p = np.clip(p, 0.5 / trials, 1 - 0.5 / trials)
    return np.log(p / (1 - p))


RUN = ("width", "seed")


def run_summaries(rows: pd.DataFrame, value: str, steps: Sequence[int], by: Sequence[str] = (),
                  drop_zeros: bool = False) -> pd.DataFrame:
    """Per run and group: the mean over ``steps`` of log ``value``; columns ``[*by, width, seed, y, checkpoints]``.

    Args:
        rows: tidy rows, one per (group, width, seed, step), with ``value`` (e.g. ``"d_align"``).
        steps: the checkpoints of the window (the last third of training).
        by: group columns (layer, pool, reduction).
        drop_zeros: leave out the checkpoints whose ``value`` is 0 or less (an estimate whose ‖μ‖⁴ is not
            positive) instead of flooring them (:func:`log_floor`): what the verdicts do, so that none depends on a
            floor. ``checkpoints`` counts the rows kept.
    """
    window = rows[rows.step.isin(list(steps))].dropna(subset=[value])
    if drop_zeros:
        window = window[window[value] > 0]
    window = window.assign(y=log_floor(window[value]))
    window = window[np.isfinite(window.y)]  # d_par is +inf where its denominator is estimated at or below 0
    grouped = window.groupby([*by, *RUN], sort=True, dropna=False)
    return grouped.y.agg(["mean", "size"]).rename(columns={"mean": "y", "size": "checkpoints"}).reset_index()


def _smoothed(curve: pd.Series) -> pd.Series:
    """A held-out loss curve over checkpoints, smoothed (3-point centred mean) and made non-increasing."""
    return curve.rolling(3, center=True, min_periods=1).mean().cummin()


def matched_loss_summaries(rows: pd.DataFrame, value: str, offsets: Sequence[float],
                           by: Sequence[str] = ()) -> pd.DataFrame:
    """Per run, group and loss level: log ``value`` interpolated where the smoothed held-out loss reaches the level.

    Each run's held-out loss curve is smoothed (:func:`_smoothed`); the base level is the
    highest final smoothed loss of any run (every run reaches it) and ``offsets`` (nats)
    add higher ones. A run crosses a level between two checkpoints; the crossing step and
    log ``value`` are interpolated linearly there. Columns ``[*by, loss_level, loss_offset,
    width, seed, y, step]`` (``step``: the fractional crossing step).
    """
    clean = rows.dropna(subset=[value, "heldout_loss"])
    if clean.empty:
        return pd.DataFrame(columns=[*by, "loss_level", "loss_offset", *RUN, "y", "step"])
    curves = clean.groupby([*RUN, "step"]).heldout_loss.first().reset_index().sort_values([*RUN, "step"])
    curves["smooth"] = curves.groupby(list(RUN)).heldout_loss.transform(_smoothed)
    base = float(curves.groupby(list(RUN)).smooth.last().max())
    out = []
    for key, group in clean.groupby([*by, *RUN], sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        run = dict(zip([*by, *RUN], key))
        curve = curves[(curves.width == run["width"]) & (curves.seed == run["seed"])].set_index("step").smooth
        series = group.groupby("step")[value].first().reindex(curve.index)
        logs = log_floor(series.to_numpy())
        loss, steps = curve.to_numpy(), curve.index.to_numpy(dtype=float)
        for offset in offsets:
            level = base + offset
            below = np.nonzero(loss <= level + 1e-12)[0]
            if not len(below):
                continue
            i = int(below[0])
            if i == 0 or not np.isfinite(logs[i - 1]):
                step, y = steps[i], logs[i]
            else:  # linear interpolation between checkpoints i-1 (above the level) and i (at or below)
                t = (loss[i - 1] - level) / (loss[i - 1] - loss[i]) if loss[i - 1] != loss[i] else 1.0
                step, y = steps[i - 1] + t * (steps[i] - steps[i - 1]), logs[i - 1] + t * (logs[i] - logs[i - 1])
            if np.isfinite(y):
                out.append({**run, "loss_level": round(level, 4), "loss_offset": offset, "y": float(y),
                            "step": float(step)})
    return pd.DataFrame(out, columns=[*by, "loss_level", "loss_offset", *RUN, "y", "step"])


def detectable_slope(se: float, df: int, confidence: float = 0.95, target_power: float = 0.8) -> float:
    """The smallest |slope| whose interval excludes 0 on its side with probability ``target_power``."""
    from scipy import stats
    if not (np.isfinite(se) and df >= 1):
        return math.nan
    critical = stats.t.ppf(1 - (1 - confidence) / 2, df)
    low, high = 0.0, critical + 10.0  # bisect on the noncentrality that reaches the power
    delta = high
    for _ in range(80):
        delta = (low + high) / 2
        if stats.nct.sf(critical, df, delta) < target_power:
            low = delta
        else:
            high = delta
    return float(delta * se)


def power(slope: float, se: float, df: int, confidence: float = 0.95) -> float:
    """Probability that the interval lies on ``slope``'s side of 0 when the true slope is ``slope``."""
    from scipy import stats
    critical = stats.t.ppf(1 - (1 - confidence) / 2, df)
    return float(stats.nct.sf(critical, df, abs(slope) / se))


def design_se(sigma: float, widths: Sequence[float], seeds: int) -> tuple[float, int]:
    """(SE of the slope, degrees of freedom) of a design: ``seeds`` runs at each of ``widths``, run noise ``sigma``.

    Raises ValueError where the design has no slope on log width to estimate (fewer than two distinct widths, or
    fewer than one seed): its SE would be a division by zero."""
    x = np.log(np.asarray(widths, dtype=float))
    if len(np.unique(x)) < 2 or seeds < 1:
        raise ValueError(f"design_se: a slope on log width needs at least two distinct widths and one seed each "
                         f"(got widths {tuple(widths)}, {seeds} seeds): add a width to size the design")
    spread = float(((x - x.mean()) ** 2).sum()) * seeds
    return sigma / math.sqrt(spread), len(widths) * seeds - 2


def seeds_for_power(sigma: float, widths: Sequence[float], slope: float = PAPER_SLOPE, target_power: float = 0.8,
                    confidence: float = 0.95, most: int = 200) -> int:
    """The fewest seeds per width whose design detects ``slope`` with ``target_power`` (``most`` + 1 if none do)."""
    for seeds in range(2, most + 1):
        se, df = design_se(sigma, widths, seeds)
        if power(slope, se, df, confidence) >= target_power:
            return seeds
    return most + 1


def label_for(lo: float, hi: float, reference: float, direction: int | None = None) -> str:
    """The label of an interval ``[lo, hi]`` for a claim whose paper slope is ``reference`` (sign = direction).

    ``reproduced`` when the interval lies on the claimed side of 0, ``contradicted`` when it lies beyond
    ``reference`` on the other side (below +0.50 for "rises" with the paper's number; below 0 for a claim judged on
    its sign, ``reference = SIGN``), ``inconclusive`` whenever it holds a threshold it must clear. ``direction``
    (+1 rises, −1 falls) is needed where ``reference`` is 0.
    """
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "not run"
    if direction is None:
        if reference == 0:
            raise ValueError("label_for: a sign-only reference (0) needs direction=+1 (rises) or -1 (falls)")
        direction = 1 if reference > 0 else -1
    if direction < 0:  # "falls": mirror
        lo, hi, reference = -hi, -lo, -reference
    if lo > 0:
        return "reproduced"
    if hi < reference:
        return "contradicted"
    return "inconclusive"


def slope_test(summaries: pd.DataFrame, reference: float = PAPER_SLOPE, confidence: float = 0.95,
               target_power: float = 0.8, direction: int | None = None) -> dict:
    """OLS slope of ``y`` on log ``width`` over runs (one row each), its interval, power and label.

    Returns a dict with :data:`SLOPE_COLUMNS`: ``slope`` with ``slope_lo``/``slope_hi`` (t interval,
    ``df = n_runs − 2``), ``se``, ``sigma`` (residual SD of a run summary), ``detectable`` (the smallest
    slope found with ``target_power``), ``label`` (:func:`label_for`), and ``widths``/``means`` (the
    per-width means of y, as ``exp`` for a log quantity, "/"-joined). Fewer than 2 widths or 3 runs: NaN and
    ``"not run"``.
    """
    from scipy import stats
    data = summaries[np.isfinite(summaries.y.astype(float))]
    widths = sorted(data.width.unique())
    row = dict(n_widths=len(widths), n_runs=len(data), reference=reference,
               widths="/".join(f"{w:g}" for w in widths),
               means="/".join(f"{data[data.width == w].y.mean():.4g}" for w in widths))
    nan = dict(slope=math.nan, slope_lo=math.nan, slope_hi=math.nan, se=math.nan, df=max(len(data) - 2, 0),
               sigma=math.nan, detectable=math.nan, label="not run")
    if len(widths) < 2 or len(data) < 3:
        return {name: {**row, **nan}[name] for name in SLOPE_COLUMNS}
    x, y = np.log(data.width.to_numpy(dtype=float)), data.y.to_numpy(dtype=float)
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    slope = float((xc * (y - y.mean())).sum() / sxx)
    residuals = y - y.mean() - slope * xc
    df = len(y) - 2
    sigma = float(np.sqrt((residuals ** 2).sum() / df))
    se = sigma / math.sqrt(sxx)
    half = float(stats.t.ppf(1 - (1 - confidence) / 2, df)) * se
    row.update(slope=slope, slope_lo=slope - half, slope_hi=slope + half, se=se, df=df, sigma=sigma,
               detectable=detectable_slope(se, df, confidence, target_power),
               label=label_for(slope - half, slope + half, reference, direction))
    return {name: row[name] for name in SLOPE_COLUMNS}


def noise_components(summaries: pd.DataFrame, per_checkpoint: pd.DataFrame | None = None) -> dict[str, float]:
    """The noise of run summaries around their width's mean, for designing a sweep.

    Args:
        summaries: :func:`run_summaries` rows (``width``, ``seed``, ``y``, ``checkpoints``).
        per_checkpoint: optional rows of log values per checkpoint (``width``, ``seed``, ``y``) of the same runs:
            splits the noise into the part between checkpoints of one run and the part between runs.

    Returns:
        ``run_sd`` (SD of a run summary within a width), and with ``per_checkpoint``: ``checkpoint_sd`` (SD of one
        checkpoint around its run's mean), ``between_sd`` (SD of a run's true level within a width; 0 when the
        checkpoint noise explains all of ``run_sd``) and ``checkpoints`` (the median count per run).
    """
    within = summaries.y - summaries.groupby("width").y.transform("mean")
    seeds = summaries.groupby("width").y.transform("size")
    dof = int((seeds > 1).sum() - summaries[seeds > 1].width.nunique())
    run_sd = float(np.sqrt((within[seeds > 1] ** 2).sum() / dof)) if dof > 0 else math.nan
    out = {"run_sd": run_sd}
    if per_checkpoint is not None and len(per_checkpoint):
        deviation = per_checkpoint.y - per_checkpoint.groupby(list(RUN)).y.transform("mean")
        sizes = per_checkpoint.groupby(list(RUN)).y.transform("size")
        dof_c = int(len(per_checkpoint) - per_checkpoint.groupby(list(RUN)).ngroups)
        checkpoint_sd = float(np.sqrt((deviation[sizes > 1] ** 2).sum() / dof_c)) if dof_c > 0 else math.nan
        count = float(summaries.checkpoints.median())
        between = run_sd ** 2 - checkpoint_sd ** 2 / count
        out.update(checkpoint_sd=checkpoint_sd, between_sd=float(np.sqrt(max(between, 0.0))), checkpoints=count)
    return out


def simulate_labels(widths: Sequence[float], seeds: int, slope: float, *, run_sd: float | None = None,
                    between_sd: float | None = None, checkpoint_sd: float | None = None, checkpoints: int = 1,
                    residuals: Sequence[float] | None = None, reference: float = PAPER_SLOPE, trials: int = 2000,
                    confidence: float = 0.95, seed: int = 0, direction: int | None = None) -> pd.Series:
    """Share of each label over ``trials`` synthetic tables with ``slope`` built in.

    Each synthetic run at width N has summary ``slope · log N + noise``. The noise is either
    Gaussian with the components of :func:`noise_components` (``between_sd`` per run plus the mean
    of ``checkpoints`` draws of ``checkpoint_sd``, or ``run_sd`` alone), or, with ``residuals``,
    drawn with replacement from measured run residuals (a run's summary minus its width's mean,
    scaled by √(s/(s−1)) for the seeds s that mean was taken over): heavy tails and skew kept.

    Returns:
        The share of each of :data:`LABELS` (a Series indexed by label).
    """
    from scipy import stats
    rng = np.random.default_rng(seed)
    x = np.repeat(np.log(np.asarray(widths, dtype=float)), seeds)
    shape = (trials, len(x))
    if residuals is not None:
        noise = rng.choice(np.asarray(residuals, dtype=float), size=shape, replace=True)
    elif checkpoint_sd is not None:
        noise = (rng.normal(0, between_sd or 0.0, shape)
                 + rng.normal(0, checkpoint_sd / math.sqrt(checkpoints), shape))
    else:
        noise = rng.normal(0, run_sd, shape)
    y = slope * x + noise  # (trials, runs): every synthetic table at once, fitted as slope_test fits one
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    fitted = (y - y.mean(axis=1, keepdims=True)) @ xc / sxx
    residual = y - y.mean(axis=1, keepdims=True) - fitted[:, None] * xc
    df = len(x) - 2
    half = stats.t.ppf(1 - (1 - confidence) / 2, df) * np.sqrt((residual ** 2).sum(axis=1) / df / sxx)
    labels = [label_for(lo, hi, reference, direction) for lo, hi in zip(fitted - half, fitted + half)]
    return pd.Series(labels).value_counts().reindex(list(LABELS), fill_value=0) / trials


def width_residuals(summaries: pd.DataFrame) -> np.ndarray:
    """Run summaries minus their width's mean, scaled by √(s/(s−1)) to undo the fitted mean's shrinkage."""
    seeds = summaries.groupby("width").y.transform("size")
    keep = seeds > 1
    deviation = (summaries.y - summaries.groupby("width").y.transform("mean"))[keep]
    return (deviation * np.sqrt(seeds[keep] / (seeds[keep] - 1))).to_numpy()


# ---- where log d_align cannot be estimated

ESTIMABLE_SHARE = 0.5
"""A design is ``not estimable`` when the interval of ‖μ‖² holds 0 (or d_align reads 0) at more than this share of
the checkpoints a verdict reads: there the estimate of d_align is noise around 0, and any slope of its log would
depend on the floor put under the log."""


def estimability(rows: pd.DataFrame, value: str = "d_align") -> dict:
    """How many of ``rows`` (one per checkpoint of a run) carry an estimate of ``value`` that is informative.

    Counts the rows whose ‖μ‖² interval holds 0 (``mean_sq_lo ≤ 0``; absent columns count as informative) or whose
    ``value`` is 0 or less (its ‖μ‖⁴ estimate not positive). Returns ``checkpoints``, ``holds_zero`` (interval holds
    0, or the value is not positive), ``zeros`` (the value is not positive) and ``estimable`` (``holds_zero`` at most
    :data:`ESTIMABLE_SHARE` of ``checkpoints``; False for no rows).
    """
    rows = rows.dropna(subset=[value])
    zeros = rows[value] <= 0
    holds = zeros | (rows.mean_sq_lo <= 0 if "mean_sq_lo" in rows else False)
    n = len(rows)
    return dict(checkpoints=n, holds_zero=int(holds.sum()), zeros=int(zeros.sum()),
                estimable=bool(n) and int(holds.sum()) <= ESTIMABLE_SHARE * n)


@dataclass(frozen=True)
class Verdict:
    """A computed verdict on one claim: ``label`` (one of :data:`LABELS`) and ``sentence``.

    ``scale``: " at this scale" where the regime judged is not the paper's (empty where it is), printed after the
    label in the sentence and in :attr:`shown`."""

    claim: str
    label: str
    sentence: str
    slope: float = math.nan
    slope_lo: float = math.nan
    slope_hi: float = math.nan
    detectable: float = math.nan
    reference: float = math.nan
    scale: str = ""
    details: dict = field(default_factory=dict, compare=False, hash=False)
    """What the claims table shows beside the label (the decomposition of matched loss, the variants, the derived
    reference), by column name: see :func:`dalign_repro.report.describe.width_verdicts`."""

    @property
    def shown(self) -> str:
        """The label as a page shows it: "contradicted at this scale" where the regime is not the paper's."""
        return self.label + (self.scale if self.label not in ("not run",) else "")

    def markdown(self) -> str:
        """The sentence for a chapter: the label in bold, math for d_align, β and (M, K), module names as code."""
        text = self.sentence.replace(self.shown, f"**{self.shown}**", 1)
        text = re.sub(r"\bat ([A-Za-z_]\w*(?:\.\w+)+) \(", r"at `\1` (", text)
        for plain, typeset in (("d_align", r"$d_{\mathrm{align}}$"), ("(M, K)", "$(M, K)$"),
                               ("heldout pool", "held-out pool")):
            text = text.replace(plain, typeset)
        return text


def _reference_text(reference: float, direction: int) -> str:
    """How a claim's reference reads in a sentence."""
    if reference == 0:
        return (f"The paper gives this claim a direction and no number for this family, so it is judged on its sign "
                f"({'a rise' if direction > 0 else 'a fall'}: the interval on the claimed side of 0)")
    return f"The paper's effect is a slope of {reference:+.2f}"


def verdict(row: pd.Series | dict | None, claim: str, *, quantity: str = "log d_align", direction: int | None = None,
            scale: str = "", note: str = "", sign_holds: bool | None = None, details: dict | None = None,
            reference_text: str | None = None) -> Verdict:
    """Judge ``claim`` from one slope-test row (:func:`slope_test`), with the sentence a chapter prints.

    ``direction`` (+1 rises, −1 falls) is needed for a row judged on its sign (``reference`` 0); ``scale`` is
    appended to the label (" at this scale"); ``note`` is a sentence appended to the verdict's. ``sign_holds``:
    whether the sign of the trend survives the verdict's variants (:mod:`dalign_repro.sweep.robustness`); where it
    is False the sentence states no direction ("moves the other way"), only where the interval lies. ``details``
    are carried to :attr:`Verdict.details`; ``reference_text`` replaces the sentence that says what the claim is
    judged against (a reference derived for the design, not the paper's number).
    """
    if row is None or (isinstance(row, pd.Series) and row.empty) or row.get("label", "not run") == "not run":
        return Verdict(claim, "not run", f"{claim}: not run at this profile (no slope could be fitted).")
    label, reference = row["label"], float(row["reference"])
    direction = direction if direction is not None else (1 if reference >= 0 else -1)
    lo, hi, slope = float(row["slope_lo"]), float(row["slope_hi"]), float(row["slope"])
    word = "rise" if direction > 0 else "fall"
    beyond = (hi < reference if direction > 0 else lo > reference) and reference != 0
    reading = {
        "reproduced": f"the interval excludes 0 on the claimed side"
                      f"{' (though it also excludes the paper-sized effect)' if beyond else ''}"
                      f"{'; that sign does not hold in every variant' if sign_holds is False else ''}",
        "contradicted": (("the interval lies on the wrong side of 0: the quantity moves the other way"
                          if sign_holds is not False else
                          f"the interval lies on the wrong side of 0, so any {word} is smaller than claimed; that "
                          "sign does not hold in every variant, so no direction is read from it")
                         if (hi < 0 if direction > 0 else lo > 0) else
                         f"the interval excludes the paper-sized {word}: any {word} is smaller than claimed"),
        "inconclusive": ("the interval holds 0: this design cannot tell a " + word + " from none" if reference == 0
                         else "the interval holds both 0 and the paper-sized effect: this design cannot tell them "
                              "apart"),
    }[label]
    sentence = (f"{claim}: {label}{scale}. The slope of {quantity} on log width is {slope:+.2f}, 95% interval "
                f"[{lo:+.2f}, {hi:+.2f}], over {int(row['n_runs'])} runs at {int(row['n_widths'])} widths; "
                f"{reading}. {reference_text or _reference_text(reference, direction)}; this design detects slopes of "
                f"{float(row['detectable']):.2f} or more in size with 80% power." + (f" {note}" if note else ""))
    return Verdict(claim, label, sentence, slope, lo, hi, float(row["detectable"]), reference, scale,
                   dict(details or {}))


def not_estimable(claim: str, counts: dict, scale: str = "") -> Verdict:
    """The verdict of a claim whose d_align is noise around 0 at most checkpoints it reads (:func:`estimability`)."""
    sentence = (f"{claim}: not estimable{scale}. The interval of ‖μ‖² holds 0 (or d_align reads 0) at "
                f"{counts['holds_zero']} of the {counts['checkpoints']} late checkpoints (d_align is exactly 0 at "
                f"{counts['zeros']}), more than {ESTIMABLE_SHARE:.0%}: the mean gradient is not resolved from the "
                "noise at this design, so log d_align has no estimate to fit and any slope of it would be set by the "
                "floor put under the log.")
    return Verdict(claim, "not estimable", sentence, scale=scale)
