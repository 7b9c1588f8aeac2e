"""What the width chapters (02 LLaMA, 03 Pythia, 04 ResNet-20) compute for their first screen and their glue.

* :func:`late_run_means`: each run's late-window mean of log d_align, exactly as the verdict reads it.
* :func:`verdict_numbers`: a verdict's label, slope, interval and detectable slope as the strings a chapter glues.
* :func:`magnitude`: the median d_align the verdict's window holds (the regime's size, beside the paper's 3.9–9.5).
* :func:`verdict_figure`: the one figure of a width claim: run means against width, the fitted slope, the paper's.
* :func:`trajectory_figure`: held-out d_align along training, seed mean per width (one panel).
* :func:`mean_figure`: each run's ||mu||^2 with its interval against width (is the mean resolved from 0?).
* :func:`budget_figure`: the empirical misalignment against the budget M = K, one line per width.
* :func:`checkpoint_row`: the geometry table's row of one run's checkpoint (to set a hand computation beside it).
* :func:`train_over_heldout`: how far the train-mean misalignment (the growth setting) lies above the held-out one.
* :func:`agreement`, :func:`retrained_gap`: that hand computation against the table, and how far a model retrained
  on this machine lies from the table's run, against the spread of the seeds.

A chapter's prose is hand-written Markdown; these only turn the committed tables into the numbers and the figure it
shows, so a verdict is computed from the tables and could have come out either way.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dalign_repro.report.describe.verdicts import judged_geometry, late_steps
from dalign_repro.report.figure_style import (COLUMN_WIDTH, LABELS, empty, legend, palette, ticks_at, trained_mask,
                                             value_axis, width_axis)
from dalign_repro.sweep.trend import run_summaries

__all__ = ["late_run_means", "verdict_numbers", "magnitude", "number", "verdict_figure", "trajectory_figure",
           "mean_figure", "budget_figure", "checkpoint_row", "agreement", "retrained_gap",
           "train_over_heldout"]

DASH = "–"
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def late_run_means(geometry: pd.DataFrame, trend: pd.DataFrame, layer: str | None) -> pd.DataFrame:
    """One row per trained run: ``width``, ``seed``, ``y`` (the mean of log d_align over the late window, zeros left
    out as the verdict leaves them out) and ``checkpoints`` (how many the mean holds). Empty when nothing trained."""
    judged = judged_geometry(geometry, trend, layer)
    if judged.empty:
        return pd.DataFrame(columns=["width", "seed", "y", "checkpoints"])
    return run_summaries(judged, "d_align", late_steps(judged), drop_zeros=True)


def _signed(value: float) -> str:
    return DASH if not math.isfinite(value) else f"{value:+.2f}".replace("-", "−")


def verdict_numbers(verdict) -> dict[str, str]:
    """A :class:`~dalign_repro.sweep.trend.Verdict` as strings to glue: ``label`` (with " at this scale"), ``slope``,
    ``interval`` (``[lo, hi]``), ``detectable`` and ``runs`` (a dash where the test did not run)."""
    return dict(label=verdict.shown, slope=_signed(verdict.slope),
                interval=(DASH if not math.isfinite(verdict.slope_lo)
                          else f"[{_signed(verdict.slope_lo)}, {_signed(verdict.slope_hi)}]"),
                detectable=DASH if not math.isfinite(verdict.detectable) else f"{verdict.detectable:.2f}")


def magnitude(geometry: pd.DataFrame, trend: pd.DataFrame, layer: str | None) -> float:
    """The median d_align over the judged rows of the verdict's late window (NaN when none trained)."""
    judged = judged_geometry(geometry, trend, layer)
    if judged.empty:
        return math.nan
    return float(judged[judged.step.isin(late_steps(judged))].d_align.median())


def number(value: float) -> str:
    """A d_align-sized number for prose (plain text, no math): 3 significant digits, powers of ten outside
    0.001–100,000 written with superscripts (``3.8 × 10⁻⁶``)."""
    if not math.isfinite(value):
        return DASH
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.3g}"
    exponent = math.floor(math.log10(abs(value)))
    return f"{value / 10 ** exponent:.2g} × 10{str(exponent).translate(SUPERSCRIPT)}"


def checkpoint_row(geometry: pd.DataFrame, width: int, seed: int, step: int, layer: str,
                   reduction: str | None = None, pool: str = "heldout") -> pd.Series | None:
    """The geometry table's row for one run's checkpoint (None where the table has none)."""
    rows = geometry[(geometry.width == width) & (geometry.seed == seed) & (geometry.step == step)
                    & (geometry.layer == layer) & (geometry.pool == pool)]
    if reduction is not None and "reduction" in rows:
        rows = rows[rows.reduction == reduction]
    return rows.iloc[0] if len(rows) else None


def verdict_figure(means: pd.DataFrame, verdict, reference: float | None = None, title: str | None = None, ax=None):
    """The width claim at a glance: each run's late-window d_align (the geometric mean over its checkpoints) against
    width, the seed mean per width, the fitted slope and, where the claim has one, the paper's slope drawn through
    the same centre. ``means`` from :func:`late_run_means`; ``ax``: draw into these axes (one panel of a figure the
    caller made, which then places the legend), else a new one-panel figure with its legend below."""
    import matplotlib.pyplot as plt

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.6))
    fig = ax.figure
    if title:
        ax.set_title(title)
    if means.empty:
        empty(ax)
        return fig
    colours = palette(means.width)
    values = np.exp(means.y.astype(float))
    ax.scatter(means.width, values, s=22, color=[colours[w] for w in means.width], alpha=0.8,
               label="one run (seed)", zorder=3)
    per_width = means.groupby("width").y.mean()
    ax.plot(per_width.index, np.exp(per_width.values), "k_", ms=18, mew=2, label="seed mean", zorder=4)
    x = np.log(means.width.astype(float))
    centre, level = float(x.mean()), float(means.y.mean())
    grid = np.linspace(x.min(), x.max(), 50)
    if math.isfinite(verdict.slope):
        ax.plot(np.exp(grid), np.exp(level + verdict.slope * (grid - centre)), "-", color="C3", lw=2,
                label="fitted slope")
    if reference:
        ax.plot(np.exp(grid), np.exp(level + reference * (grid - centre)), "--", color="0.3", lw=1.5,
                label=f"paper's slope {_signed(reference)}")
    width_axis(ax, means.width)
    value_axis(ax, values)
    ax.set_ylabel(f"late-window {LABELS['d_align']}")
    if own:
        legend(ax, ncols=2)
    return fig


def budget_figure(misalignment: pd.DataFrame, title: str | None = None):
    """The empirical misalignment (held-out/held-out) against the budget M = K, seed mean per width."""
    import matplotlib.pyplot as plt

    part = misalignment[(misalignment.setting == "heldout/heldout") & (misalignment.M == misalignment.K)
                        & trained_mask(misalignment)] if len(misalignment) else misalignment
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.4))
    if part.empty:
        empty(ax)
        return fig
    colours = palette(part.width)
    for width, runs in part.groupby("width"):
        stats = runs.groupby("M").p_misalign.mean()
        ax.plot(stats.index, stats.values, "o-", color=colours[width], label=f"$N = {width}$")
    ax.set_xscale("log", base=2)
    ticks_at(ax.xaxis, part.M)
    ax.set(xlabel="examples on each side, $M = K$", ylabel=r"empirical $\Pr(\mu_M^\top g_K \leq 0)$")
    if title:
        ax.set_title(title)
    legend(ax, ncols=4)
    return fig


def trajectory_figure(geometry: pd.DataFrame, layer: str, reduction: str | None = None, title: str | None = None):
    """Held-out d_align at ``layer`` along training: the seed mean per width (geometric mean, zeros left out), one
    panel, log scale; the last third of training (the verdict's window) shaded."""
    import matplotlib.pyplot as plt

    rows = geometry[trained_mask(geometry)] if len(geometry) else geometry
    if len(rows):
        rows = rows[(rows.layer == layer) & (rows.pool == "heldout") & (rows.d_align > 0)]
        if reduction is not None and "reduction" in rows:
            rows = rows[rows.reduction == reduction]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.4))
    if rows.empty:
        empty(ax)
        return fig
    colours = palette(rows.width)
    for width, part in rows.groupby("width"):
        mean = np.exp(np.log(part.d_align).groupby(part.step).mean())
        ax.plot(mean.index, mean.values, "o-", ms=3.5, color=colours[width], label=f"$N = {width}$")
    last = rows.step.max()
    ax.axvspan(2 * last / 3, last, color="0.9", zorder=0, label="verdict's window")
    value_axis(ax, rows.d_align)
    ax.set(xlabel="training step", ylabel=f"held-out {LABELS['d_align']}")
    if title:
        ax.set_title(title)
    legend(ax, ncols=3)
    return fig


def mean_figure(geometry: pd.DataFrame, trend: pd.DataFrame, layer: str | None, step: int, title: str | None = None):
    """Whether the mean gradient is resolved: each trained run's unbiased ||mu||^2 at checkpoint ``step`` with its
    jackknife 95% interval, against width (seeds side by side), and the line at 0. An interval that holds 0 is a
    mean the pool cannot tell from none, and then log d_align has no value to fit."""
    import matplotlib.pyplot as plt

    rows = judged_geometry(geometry, trend, layer)
    rows = rows[rows.step == step] if len(rows) else rows
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.4))
    if title:
        ax.set_title(title)
    if rows.empty:
        empty(ax)
        return fig
    colours = palette(rows.width)
    widths = sorted(rows.width.unique())
    for i, width in enumerate(widths):
        part = rows[rows.width == width].sort_values("seed")
        offsets = np.linspace(-0.25, 0.25, len(part)) if len(part) > 1 else np.zeros(1)
        lo = part.mean_sq - part.mean_sq_lo if "mean_sq_lo" in part else None
        hi = part.mean_sq_hi - part.mean_sq if "mean_sq_hi" in part else None
        ax.errorbar(i + offsets, part.mean_sq, yerr=None if lo is None else [lo, hi], fmt="o", ms=4, capsize=2,
                    color=colours[width], label=f"$N = {width}$")
    ax.axhline(0, color="0.3", lw=1)
    ax.set_xticks(range(len(widths)), [str(w) for w in widths])
    ax.set(xlabel="width $N$ (seeds side by side)", ylabel=f"{LABELS['mean_sq']} with 95% interval")
    value_axis(ax, np.r_[rows.mean_sq, rows.get("mean_sq_lo", rows.mean_sq)])
    return fig


def agreement(by_hand: float, table: float, short: bool = False) -> str:
    """How a hand computation on a cached run agrees with the sweep's table for the same checkpoint, in words: the
    same number, or the relative difference and why a retrained model can differ (float-level training differences
    between machines). ``short``: the clause alone, for a parenthesis."""
    if not (math.isfinite(by_hand) and math.isfinite(table)):
        return "the table has no row for this run" if short else ""
    if table == by_hand or (table and abs(by_hand / table - 1) < 5e-7):
        return "the same number" if short else "The two are the same number: the cache holds the sweep's weights."
    gap = abs(by_hand / table - 1) if table else math.inf
    clause = f"they differ by {gap:.1%}"
    if short:
        return clause + ": this model was retrained here, not loaded"
    return (f"The two differ by {gap:.1%}: the cached model was retrained, and training repeats bitwise only on the "
            "machine and thread count that first ran it; elsewhere its float-level differences grow along training, "
            "and one checkpoint's geometry magnifies them.")


def retrained_gap(loss: float, table_loss: float, seed_losses) -> str:
    """How far a model retrained on this machine lies from the table's run, in one sentence: the gap of the final
    held-out losses (nats) beside their range over the seeds of the same width (``seed_losses``, nats).

    Training repeats bitwise only on the machine and thread count that first ran it; elsewhere float-level
    differences grow along training, and the loss says how far. Where the gap reaches half the seeds' range, a run
    retrained on another machine is as good as another seed, so the seed spread (which a verdict's interval over
    seeds carries) is the error bar across machines; "" where the two losses are the same (the same weights)."""
    if not (math.isfinite(loss) and math.isfinite(table_loss)) or loss == table_loss:
        return ""
    gap = abs(loss - table_loss)
    seeds = np.asarray([v for v in seed_losses if math.isfinite(v)], dtype=float)
    text = (f"Retrained on the machine that built this page, the model's held-out loss differs from the table's by "
            f"{gap:.2g} nats")
    if len(seeds) < 2:
        return text + "."
    spread = float(seeds.max() - seeds.min())
    text += f"; the final held-out losses of this width's {len(seeds)} seeds span {spread:.2g} nats"
    if gap >= spread / 2:
        return text + (": the float-level differences between machines grew along training to the size of a change "
                       "of seed. For this family a run retrained elsewhere is another draw, and the seed spread, which "
                       "the verdict's interval over seeds carries, is the error bar across machines.")
    return text + (": the retrained run stays well within the seed spread, which the verdict's interval over seeds "
                   "carries.")


def train_over_heldout(misalignment: pd.DataFrame, M: int, K: int) -> float:
    """The mean misalignment rate with mu_M from training sequences (``train/heldout``, the growth setting, which no
    certificate covers: the two means come from different distributions) over the rate with both means from the
    held-out pool (``heldout/heldout``), over the trained models at budget (M, K); NaN where either is missing."""
    at = misalignment[(misalignment.M == M) & (misalignment.K == K)] if len(misalignment) else misalignment
    at = at[trained_mask(at)] if len(at) else at
    rate = {setting: at[at.setting == setting].p_misalign.mean() for setting in ("train/heldout", "heldout/heldout")}
    below = rate["heldout/heldout"]
    return float(rate["train/heldout"] / below) if len(at) and below > 0 else math.nan

