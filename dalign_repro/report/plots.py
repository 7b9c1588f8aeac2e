"""The figures of the width and theory chapters, drawn in the shared style of :mod:`dalign_repro.report.figure_style`.

Each function takes the tidy tables :mod:`dalign_repro.sweep.run` (or
:mod:`dalign_repro.experiments.theory`) writes and returns a matplotlib Figure drawn
for the book's 700-pixel column and readable on a 390-pixel phone: :data:`COLUMN_WIDTH` inches wide at
:data:`~dalign_repro.report.figure_style.DPI`, fonts of 10 pt and more (:func:`style` sets them; call it once per
notebook),
math labels, and tick labels written as plain numbers (``0.01``, ``200``) or powers
of ten (``10^{-5}``), never as ``4.0776×10⁻²``. Each figure carries one idea;
where a chapter compares several quantities it draws several figures.

Runs that failed to train are drawn in grey and labelled, never as data points of a
trend, so every figure also renders at the ``smoke`` profile, where the tiny models
fail by design.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import pandas as pd

try:  # the figures need the plots extra (matplotlib, seaborn); the rest of dalign_core does not
    import matplotlib.pyplot as plt
    import seaborn as sns
except ImportError as err:  # pragma: no cover  (both are installed wherever the book is built)
    raise ImportError(f"dalign_repro.report.plots draws with matplotlib and seaborn, which are not installed ({err}); "
                      "install the plots extra: pip install 'dalign[plots]'") from err

from dalign_repro.report.figure_style import (LABELS, NOISE_NAMES, FAILED, COLUMN_WIDTH, DPI, RC, style, tick_label,
                                             log_ticks, value_axis, ticks_at, width_axis, palette, trained_mask,
                                             legend, legend_below, failed_note, natural, empty)

__all__ = ["style", "LABELS", "COLUMN_WIDTH", "DPI", "RC", "tick_label", "log_ticks", "value_axis", "learning_rates",
           "heldout_loss", "trajectory", "trend_along_training", "reductions_compared", "matched_loss",
           "final_geometry", "layers_heatmap", "misalignment_by_width", "misalignment_by_budget", "sample_unit",
           "sample_unit_context", "sample_unit_choice", "theory_moment_errors", "theory_certificates",
           "theory_estimator_bias", "theory_sketch", "certificate_by_budget"]


def learning_rates(lr: pd.DataFrame) -> plt.Figure:
    """Validation loss against the peak learning rate, one line per width; the kept rate circled."""
    lr = lr[~lr.check.astype(bool)] if "check" in lr and len(lr) else lr  # the full-length check: in the text
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.75, 3.4))
    colours = palette(lr.width)
    for width, part in lr.groupby("width"):
        part = part.sort_values("lr")
        finite = part[np.isfinite(part.validation_loss)]
        ax.plot(finite.lr, finite.validation_loss, "o-", color=colours[width], label=f"$N = {width}$")
        chosen = part[part.chosen.astype(bool)]
        ax.plot(chosen.lr, chosen.validation_loss, "o", ms=12, mfc="none", mec=colours[width], mew=1.5)
        for row in part[~np.isfinite(part.validation_loss)].itertuples():
            ax.annotate("diverged", (row.lr, finite.validation_loss.max()), fontsize=10, color="0.4")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="validation loss (nats)")
    log_ticks(ax.xaxis, lr.lr)
    legend(ax, title="the rate kept for each width is circled", ncols=4)
    return fig


def heldout_loss(runs: pd.DataFrame, value: str = "heldout_loss", bar: float | None = None,
                 bar_label: str = "bigram baseline") -> plt.Figure:
    """A final held-out score of every run against width (default: the loss), beside the bar it must clear.

    ``bar`` defaults to the run's ``baseline_loss``; pass ``value="test_accuracy"`` with
    ``bar=<floor>`` for a classifier's accuracy.
    """
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.75, 3.3))
    ok = trained_mask(runs)
    ax.plot(runs.width[ok], runs[value][ok], "o", color="C0", alpha=0.7, label="run")
    means = runs[ok].groupby("width")[value].mean()
    ax.plot(means.index, means.values, "-", color="C0", label="mean over seeds")
    if (~ok).any():
        ax.plot(runs.width[~ok], runs[value][~ok], "x", color="0.5", label=f"failed run ({(~ok).sum()})")
    if bar is None and "baseline_loss" in runs and len(runs):
        bar = runs.baseline_loss.iloc[0]
    if bar is not None:
        ax.axhline(bar, color="C3", ls="--", lw=1, label=bar_label)
    width_axis(ax, runs.width if len(runs) else [1])
    ax.set_ylabel({"heldout_loss": "held-out loss (nats)", "test_accuracy": "test accuracy"}.get(value, value))
    legend(ax)
    return fig


def trajectory(geometry: pd.DataFrame, layer: str, value: str = "d_align") -> plt.Figure:
    """``value`` along training at ``layer``, one line per width (seed mean, band: seed range); pools side by side."""
    pools = [p for p in ("heldout", "train") if p in set(geometry.pool)] or ["heldout"]
    fig, axes = plt.subplots(1, len(pools), figsize=(COLUMN_WIDTH, 3.5), sharey=True, squeeze=False)
    at_layer = geometry[geometry.layer == layer].assign(x=lambda t: t.step.clip(lower=1))
    colours = palette(geometry.width)
    for ax, pool in zip(axes[0], pools):
        part = at_layer[at_layer.pool == pool]
        ok = trained_mask(part)
        for (width, seed), run in part[~ok].groupby(["width", "seed"]):
            ax.plot(run.x, run[value].clip(lower=1e-8), **FAILED)
        for width, runs in part[ok].groupby("width"):
            stats = runs.groupby("x")[value].agg(["mean", "min", "max"])
            ax.plot(stats.index, stats["mean"], "o-", ms=3, color=colours[width], label=f"$N = {width}$")
            ax.fill_between(stats.index, stats["min"], stats["max"], color=colours[width], alpha=0.18, lw=0)
        failed_note(ax, part[~ok].groupby(["width", "seed"]).ngroups)
        ax.set(xscale="log", yscale="log", title=f"{'held-out' if pool == 'heldout' else pool} pool",
               xlabel="training step (0 drawn at 1)")
        log_ticks(ax.xaxis, at_layer.x)
        log_ticks(ax.yaxis, at_layer[value])
    axes[0, 0].set_ylabel(f"{LABELS.get(value, value)} at {layer}")
    legend_below(fig, axes, ncols=5)
    return fig


def trend_along_training(trend: pd.DataFrame, layer: str, steps: int, reduction: str | None = None) -> plt.Figure:
    """The slope of log d_align on log width at each checkpoint, with its 95% interval; last third shaded.

    Each checkpoint is a slope test of its own (the runs' values there), so this shows how the width trend
    moves along training; the claim is judged on each run's mean over the shaded window. The dashed line is
    the paper's slope.
    """
    from dalign_repro.sweep.trend import PAPER_SLOPE

    rows = trend[(trend.quantity == "d_align") & (trend.view == "step") & (trend.layer == layer)] \
        if len(trend) else trend
    if reduction is not None and len(rows):
        rows = rows[rows.reduction == reduction]
    rows = rows[rows.label != "not run"] if len(rows) else rows
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 3.4))
    ax.axvspan(2 * steps / 3, steps * 1.04, color="0.92", zorder=0, label="last third")
    if len(rows):
        for nudge, (pool, part) in zip((-0.008, 0.008), rows.groupby("pool")):  # keep the last third legible
            ax.errorbar(part.step + nudge * steps, part.slope,
                        yerr=[part.slope - part.slope_lo, part.slope_hi - part.slope],
                        fmt="o", capsize=3, label=f"{'held-out' if pool == 'heldout' else pool} pool")
    ax.axhline(0, color="0.3", lw=0.8)
    ax.axhline(PAPER_SLOPE, color="0.3", lw=1, ls="--", label="the paper's slope")
    ax.set(xlim=(-0.03 * steps, steps * 1.04), xlabel="training step", ylabel=LABELS["slope"])
    legend(ax)
    return fig


def reductions_compared(geometry: pd.DataFrame, layer: str, steps: Sequence[int]) -> plt.Figure:
    """Each run's late-window d_align (geometric mean over ``steps``) against width, one panel per q reduction.

    The literal shared q beside the judged per-position one: where a trained parameter owns the shared
    direction, training drives its mean, and so its d_align, toward zero at every width.
    """
    from dalign_repro.sweep.trend import run_summaries

    part = geometry[(geometry.layer == layer) & (geometry.pool == "heldout")] if len(geometry) else geometry
    reductions = sorted(part.reduction.unique()) if len(part) else []
    fig, axes = plt.subplots(1, max(len(reductions), 1), figsize=(COLUMN_WIDTH, 3.2), squeeze=False)
    for ax, reduction in zip(axes[0], reductions):
        summary = run_summaries(part[(part.reduction == reduction) & trained_mask(part)], "d_align", steps)
        ax.set_title(f"{reduction} q ({'per position' if reduction == 'full' else 'summed over positions'})")
        if summary.empty:
            empty(ax)
            continue
        ax.plot(summary.width, np.exp(summary.y), "o", alpha=0.5, ms=4)
        means = summary.groupby("width").y.mean()
        ax.plot(means.index, np.exp(means.values), "-", color="C0")
        width_axis(ax, summary.width if len(summary) else [1])
        ax.set_yscale("log")
        ax.set_ylabel(f"late-window {LABELS['d_align']}")
    return fig


def matched_loss(summaries: pd.DataFrame, layer: str) -> plt.Figure:
    """d_align against width with every run read where its smoothed held-out loss reaches each common level.

    ``summaries``: :func:`dalign_repro.sweep.trend.matched_loss_summaries` of ``d_align`` grouped by
    ``layer`` and ``pool`` (log d_align in ``y``, interpolated at the crossing): the numbers the
    matched-loss verdict reads, so the figure and the verdict cannot disagree.
    """
    part = summaries[(summaries.layer == layer) & (summaries.pool == "heldout")] if len(summaries) else summaries
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 3.4))
    levels = sorted(part.loss_level.unique()) if len(part) else []
    colours = dict(zip(levels, sns.color_palette("rocket", len(levels) + 1)))
    for level in levels:
        runs = part[part.loss_level == level].assign(d_align=lambda frame: np.exp(frame.y))
        ax.plot(runs.width, runs.d_align, "o", color=colours[level], alpha=0.45, ms=4)
        means = np.exp(runs.groupby("width").y.mean())  # the geometric mean: the verdict fits log d_align
        ax.plot(means.index, means.values, "-", color=colours[level], label=f"loss {level:.2f}")
    width_axis(ax, part.width if len(part) else [1])
    if len(part):
        value_axis(ax, np.exp(part.y))
    else:
        empty(ax)
    ax.set_ylabel(f"{LABELS['d_align']} at {layer}")
    legend(ax, ncols=3, title="each run read where its smoothed held-out loss reaches")
    return fig


def final_geometry(geometry: pd.DataFrame, layer: str, step: int,
                   quantities: tuple[str, ...] = ("mean_sq", "d_align")) -> plt.Figure:
    """``quantities`` against width at one checkpoint, both pools: seed points with jackknife bars, seed-mean lines.

    The default draws the paper's two claims, ‖μ‖² and d_align; pass ``("d_par", "d_2")``
    for the two dimensions whose minimum d_align is.
    """
    at_step = geometry[(geometry.step == step) & (geometry.layer == layer)]
    final, failed = at_step[trained_mask(at_step)], at_step[~trained_mask(at_step)]
    fig, axes = plt.subplots(1, len(quantities), figsize=(COLUMN_WIDTH, 3.5), squeeze=False)
    for ax, name in zip(axes[0], quantities):
        if len(failed):
            ax.plot(failed.width, failed[name], "x", color="0.6", label="failed run")
        for pool, colour, nudge in (("heldout", "C0", 0.96), ("train", "C1", 1.04)):
            part = final[final.pool == pool]
            lo = (part[name] - part[f"{name}_lo"]).clip(lower=0)
            hi = (part[f"{name}_hi"] - part[name]).clip(lower=0)
            ax.errorbar(part.width * nudge, part[name], yerr=[lo, hi], fmt="o", ms=3.5, color=colour, alpha=0.5,
                        lw=1)
            means = part.groupby("width")[name].mean()
            ax.plot(means.index, means.values, "-", color=colour,
                    label=f"{'held-out' if pool == 'heldout' else pool} pool (seed mean)")
        value_axis(ax, at_step[name])
        ax.set_title(LABELS[name])
        infinite = int(np.isinf(pd.to_numeric(at_step[name], errors="coerce").astype(float)).sum())
        if infinite:  # a moment estimate <= 0 makes a dimension infinite: say so, do not drop it silently
            ax.text(0.02, 0.97, f"{infinite} estimate{'s' if infinite > 1 else ''} = ∞, not drawn",
                    transform=ax.transAxes, ha="left", va="top", fontsize=10, color="0.35")
        width_axis(ax, geometry.width if len(geometry) else [1])
        if at_step.empty:
            empty(ax)
    legend_below(fig, axes)
    return fig


def layers_heatmap(geometry: pd.DataFrame, step: int) -> plt.Figure:
    """Seed-mean d_align by insertion point (in depth order) and width (held-out pool) at one checkpoint.

    Each cell prints its value in one unit, $10^e$ for the largest cell's exponent (two significant digits), so the
    numbers fit a cell of a book's column; the layers' shared name prefix labels the axis once."""
    part = geometry[(geometry.step == step) & (geometry.pool == "heldout") & trained_mask(geometry)]
    heat = part.groupby(["layer", "width"]).d_align.mean().unstack("width")
    heat = heat.loc[sorted(heat.index, key=natural)]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 0.36 * max(len(heat), 1) + 1.4))
    if heat.empty:
        empty(ax)
        ax.set_axis_off()
        return fig
    positive = heat.where(heat > 0)
    exponent = int(np.floor(np.log10(np.nanmax(positive.to_numpy())))) if positive.notna().any().any() else 0
    scaled = heat / 10.0**exponent
    # An estimate of 0 (the unbiased ||mu||^4 not positive) has no logarithm: a blank cell marked "0".
    annotations = scaled.map(lambda v: "0" if v <= 0 else f"{v:.2g}" if v >= 0.01 else "<0.01")
    prefix = os.path.commonprefix([str(name) for name in heat.index]).rpartition(".")[0]
    shown = heat.rename(index=lambda name: str(name)[len(prefix) + 1:] if prefix else str(name))
    unit = "" if exponent == 0 else rf" (cells: $\times 10^{{{exponent}}}$)"
    sns.heatmap(np.log10(shown.where(shown > 0)), annot=annotations.to_numpy(), fmt="", cmap="mako", ax=ax,
                annot_kws={"fontsize": 10}, cbar_kws={"label": r"$\log_{10} d_{\mathrm{align}}$"})
    for row, col in zip(*np.nonzero((heat <= 0).to_numpy())):
        ax.text(col + 0.5, row + 0.5, "0", ha="center", va="center", fontsize=10, color="0.3")
    ax.set(xlabel="width $N$", ylabel=f"{prefix}.<layer>" if prefix else "", title=rf"$d_{{\mathrm{{align}}}}${unit}")
    ax.grid(False)
    ax.tick_params(axis="y", rotation=0)
    return fig


def misalignment_by_width(misalignment: pd.DataFrame, M: int, K: int) -> plt.Figure:
    """Empirical misalignment (Wilson intervals) against width at one budget; B_exact, B_align where they apply."""
    fixed = misalignment[(misalignment.M == M) & (misalignment.K == K)]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.85, 3.9))
    ok = trained_mask(fixed)
    for setting, marker in (("heldout/heldout", "o"), ("train/heldout", "s")):
        part = fixed[ok & (fixed.setting == setting)]
        stats = part.groupby("width")[["p_misalign", "p_misalign_lo", "p_misalign_hi"]].mean()
        ax.errorbar(stats.index, stats.p_misalign, fmt=f"{marker}-", capsize=3,
                    yerr=[stats.p_misalign - stats.p_misalign_lo, stats.p_misalign_hi - stats.p_misalign],
                    label=f"empirical, {setting.replace('heldout', 'held-out')}")
    bounds = fixed[ok & fixed.b_exact.notna()].groupby("width")[["b_exact", "b_align"]].mean()
    ax.plot(bounds.index, bounds.b_exact, "^--", color="C2", label=LABELS["b_exact"])
    ax.plot(bounds.index, bounds.b_align, "v--", color="C3", label=LABELS["b_align"])
    failed = fixed[~ok]
    if len(failed):
        ax.plot(failed.width, failed.p_misalign, "x", color="0.5", label=f"failed run ({failed.seed.nunique()} seeds)")
    width_axis(ax, misalignment.width if len(misalignment) else [1])
    ax.set(ylim=(-0.02, 1.02), ylabel=LABELS["p_misalign"], title=f"$M = {M}$, $K = {K}$")
    legend_below(fig, ax, ncols=2)
    return fig


def misalignment_by_budget(misalignment: pd.DataFrame) -> plt.Figure:
    """Empirical misalignment (held-out/held-out) against the budget M = K, one line per width."""
    part = misalignment[(misalignment.setting == "heldout/heldout") & (misalignment.M == misalignment.K)
                        & trained_mask(misalignment)]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 3.4))
    colours = palette(misalignment.width)
    for width, runs in part.groupby("width"):
        stats = runs.groupby("M").p_misalign.agg(["mean", "min", "max"])
        ax.plot(stats.index, stats["mean"], "o-", color=colours[width], label=f"$N = {width}$")
        ax.fill_between(stats.index, stats["min"], stats["max"], color=colours[width], alpha=0.15, lw=0)
    ax.set(xscale="log", xlabel="budget $M = K$", ylabel=LABELS["p_misalign"])
    if len(part):
        ticks_at(ax.xaxis, part.M)
    else:
        empty(ax)
    legend(ax, ncols=4)
    return fig


def sample_unit_context(units: pd.DataFrame, unit: str = "sequence", reduction: str = "shared") -> plt.Figure:
    """d_align of one sample choice (default: whole sequences, shared reduction) against context, one line per width."""
    ok = units[trained_mask(units)] if len(units) else units
    part = ok[(ok.unit == unit) & (ok.reduction == reduction)] if len(ok) else ok
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 3.4))
    colours = palette(units.width)
    for width, runs in part.groupby("width"):
        stats = runs.groupby("context").d_align.mean()
        ax.plot(stats.index, stats.values, "o-", color=colours[width], label=f"$N = {width}$")
    ax.set(xscale="log", xlabel="context $T$ (tokens per sequence)",
           ylabel=f"{LABELS['d_align']} ({unit}, {reduction})")
    ticks_at(ax.xaxis, units.context if len(units) else [1])
    if len(part):
        value_axis(ax, part.d_align)
    else:
        empty(ax)
    legend(ax, ncols=4)
    return fig


def sample_unit_choice(units: pd.DataFrame, context: int | None = None) -> plt.Figure:
    """d_align of each sample choice (unit / reduction) against width at one context (default: the longest).

    A choice whose unbiased ‖μ‖⁴ estimate is not positive (the mean is lost in noise)
    reads d_align = 0 and is drawn as an open triangle at the bottom of the axis.
    """
    ok = units[trained_mask(units)].assign(choice=lambda t: t.unit + " / " + t.reduction) if len(units) else units
    context = context if context is not None else (int(units.context.max()) if len(units) else 0)
    part = ok[ok.context == context] if len(ok) else ok
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.85, 3.7))
    positive = part.d_align[part.d_align > 0] if len(part) else pd.Series(dtype=float)
    floor = positive.min() / 4 if len(positive) else 1e-6
    for index, (choice, runs) in enumerate(part.groupby("choice") if len(part) else []):
        means = runs.groupby("width").d_align.mean()
        above = means[means > 0]
        ax.plot(above.index, above.values, "o-", color=f"C{index}", label=choice)
        zero = means[means <= 0]
        if len(zero):
            ax.plot(zero.index, [floor] * len(zero), "v", color=f"C{index}", mfc="none", ms=9,
                    label=f"{choice}: ≤ 0")
    width_axis(ax, units.width if len(units) else [1])
    ax.set(yscale="log", ylabel=LABELS["d_align"], title=f"context $T = {context}$")
    if len(positive):
        log_ticks(ax.yaxis, np.append(positive.values, floor))
    else:
        empty(ax)
    legend_below(fig, ax, ncols=2)
    return fig


def sample_unit(units: pd.DataFrame) -> plt.Figure:
    """The sample-unit study's context figure (:func:`sample_unit_context`); see also :func:`sample_unit_choice`."""
    return sample_unit_context(units)


def theory_moment_errors(alignment: pd.DataFrame) -> plt.Figure:
    """Monte Carlo minus exact mean and variance of the alignment, in Monte Carlo standard errors, by noise law."""
    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH, 3.0), sharey=True)
    laws = [law for law in NOISE_NAMES if law in set(alignment.noise)]
    rng = np.random.default_rng(0)
    for ax, moment, title in zip(axes, ("mean", "var"), (r"mean $\mathbb{E}[\mu_M^\top g_K]$",
                                                         r"variance $\mathrm{Var}(\mu_M^\top g_K)$")):
        ax.axvspan(-2, 2, color="0.93", zorder=0)
        for row, law in enumerate(laws):
            part = alignment[alignment.noise == law]
            z = part[f"{moment}_rel_err"] / part[f"{moment}_rel_se"]
            ax.plot(z, row + rng.uniform(-0.18, 0.18, len(z)), "o", ms=4, alpha=0.6, color=f"C{row}")
        ax.axvline(0, color="0.3", lw=0.8)
        ax.set(title=title)
    # one label under both panels: two copies side by side run into each other in a book's column
    fig.supxlabel("(simulated − exact) / s.e. of the simulation", fontsize=plt.rcParams["axes.labelsize"])
    axes[0].set_yticks(range(len(laws)), [NOISE_NAMES[law] for law in laws])
    axes[0].set_ylim(len(laws) - 0.5, -0.5)
    return fig


def theory_certificates(alignment: pd.DataFrame) -> plt.Figure:
    """Empirical misalignment, B_exact and B_align against the snr: median over cells, bar = range over cells."""
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.85, 3.6))
    snrs = sorted(alignment.snr.unique())
    floor = 1 / alignment.trials.max() if len(alignment) else 1e-6
    quantities = (("p_misalign", "empirical " + LABELS["p_misalign"], "o"), ("b_exact", LABELS["b_exact"], "^"),
                  ("b_align", LABELS["b_align"], "v"))
    for index, (name, label, marker) in enumerate(quantities):
        stats = alignment.groupby("snr")[name].agg(["median", "min", "max"]).clip(lower=floor)
        x = np.arange(len(snrs)) + (index - 1) * 0.17
        ax.errorbar(x, stats["median"], yerr=[stats["median"] - stats["min"], stats["max"] - stats["median"]],
                    fmt=marker, ms=7, capsize=4, color=f"C{index}", label=label)
    ax.set_xticks(range(len(snrs)), [f"{s:g}" for s in snrs])
    ax.set(yscale="log", xlabel=r"snr $= \mathbb{E}\,/\,\mathrm{sd}$ of $\mu_M^\top g_K$", ylabel="probability")
    log_ticks(ax.yaxis, alignment[["p_misalign", "b_exact", "b_align"]].clip(lower=floor).values.ravel())
    legend_below(fig, ax)
    return fig


def theory_estimator_bias(estimators: pd.DataFrame, quantities: tuple[str, ...] = ("cov_energy", "d_align")
                          ) -> plt.Figure:
    """Relative error of the plug-in and U-statistic estimates against d/n: mean over replicates, band ±1 sd."""
    fig, axes = plt.subplots(1, len(quantities), figsize=(COLUMN_WIDTH, 3.4), squeeze=False)
    ratio = estimators.d / estimators.n
    for ax, name in zip(axes[0], quantities):
        error = (estimators[name] / estimators[f"{name}_true"] - 1.0).rename("error")
        for colour, method in (("C3", "plug-in"), ("C0", "u-statistic")):
            part = pd.DataFrame({"x": ratio, "error": error})[estimators.method == method]
            stats = part.groupby("x").error.agg(["mean", "std"])
            ax.plot(stats.index, stats["mean"], "o-", color=colour,
                    label={"u-statistic": "U-statistic"}.get(method, method))
            ax.fill_between(stats.index, stats["mean"] - stats["std"], stats["mean"] + stats["std"], color=colour,
                            alpha=0.18, lw=0)
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set(xscale="log", title=LABELS[name], xlabel="$d / n$")
        ticks_at(ax.xaxis, ratio)
    axes[0, 0].set_ylabel("estimate / truth − 1")
    legend_below(fig, axes)
    return fig


def theory_sketch(sketch: pd.DataFrame) -> plt.Figure:
    """Relative error of the CountSketch estimates against the sketch size k (mean, band ±1 sd), beside r / k."""
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.85, 3.6))
    for index, name in enumerate(("mean_sq", "cov_energy", "d_align")):
        stats = sketch.groupby("k")[f"{name}_rel_err"].agg(["mean", "std"])
        ax.plot(stats.index, stats["mean"], "o-", color=f"C{index}", label=LABELS[name])
        ax.fill_between(stats.index, stats["mean"] - stats["std"], stats["mean"] + stats["std"],
                        color=f"C{index}", alpha=0.15, lw=0)
    ks = np.array(sorted(sketch.k.unique()), dtype=float)
    if len(ks):
        ax.plot(ks, sketch.effective_rank.iloc[0] / ks, "k--", lw=1, label="$r / k$")
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set(xscale="log", xlabel="sketch size $k$", ylabel="sketched / exact − 1")
    ticks_at(ax.xaxis, ks if len(ks) else [1])
    legend(ax)
    return fig


def certificate_by_budget(d_align: float, d_align_lo: float | None = None, budgets=None) -> plt.Figure:
    """B_align = 1 / (1 + n_eff d_align) against the budget M = K, at an estimate and at its interval's lower end."""
    from dalign_core.geometry.bounds import b_align

    budgets = np.unique(np.round(np.geomspace(1, 1e4, 60))) if budgets is None else np.asarray(budgets, dtype=float)
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.85, 3.5))
    ax.plot(budgets, b_align(max(d_align, 0.0), budgets, budgets), "-", color="C0",
            label=f"at the estimate, {LABELS['d_align']} = {tick_label(d_align)}")
    if d_align_lo is not None:
        ax.plot(budgets, b_align(max(d_align_lo, 0.0), budgets, budgets), "--", color="C3",
                label=f"at the interval's lower end, {tick_label(max(d_align_lo, 0.0))} (the certificate)")
    ax.set(xscale="log", ylim=(0, 1.02), xlabel="budget $M = K$ (examples on each side)",
           ylabel=r"$B_{\mathrm{align}}$, bound on $\Pr(\mu_M^\top g_K \leq 0)$")
    log_ticks(ax.xaxis, budgets)
    legend(ax, ncols=1)
    return fig
