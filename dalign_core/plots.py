"""Figures of a width sweep, shared by every family's chapter.

Each function takes the tidy tables :mod:`dalign_core.sweep` writes and returns a
matplotlib Figure sized for a ~700-pixel book column (7 inches at 100 dpi), with
math labels. Runs that failed to train are drawn in grey and labelled, never as data
points of a trend, so every figure also renders at the ``smoke`` profile, where the
tiny models fail by design.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FixedLocator, LogLocator, NullFormatter, NullLocator

__all__ = ["style", "LABELS", "learning_rates", "heldout_loss", "trajectory", "trend_along_training",
           "matched_loss", "final_geometry", "layers_heatmap", "misalignment_by_width", "misalignment_by_budget",
           "sample_unit"]

LABELS = {
    "d_align": r"$d_{\mathrm{align}}$", "d_par": r"$d_{\parallel}$", "d_2": r"$d_2$", "mean_sq": r"$\|\mu\|^2$",
    "p_misalign": r"$\Pr(\mu_M^\top g_K \leq 0)$", "b_exact": r"$B_{\mathrm{exact}}$",
    "b_align": r"$B_{\mathrm{align}}$", "rho": r"Spearman $\rho$ (width, $d_{\mathrm{align}}$)",
}
FAILED = dict(color="0.6", lw=1, ls=":", alpha=0.8)
COLUMN_WIDTH = 7.0  # inches at 100 dpi: a ~700-px book column


def style() -> None:
    """Readable fonts at the column width (ticks about 13 px tall) and inline figures at 100 dpi."""
    sns.set_theme(context="notebook", style="whitegrid", font_scale=1.05)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "figure.constrained_layout.use": True,
                         "legend.fontsize": 9.5, "axes.titlesize": 11.5})


def _palette(widths) -> dict:
    widths = sorted(set(widths))
    return dict(zip(widths, sns.color_palette("viridis", len(widths))))


def _ticks_at(axis, values) -> None:
    """Ticks labelled at exactly ``values`` (widths, contexts) on a log axis, no minor ticks."""
    axis.set_major_locator(FixedLocator(sorted(set(values))))
    axis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(NullLocator())


def _width_axis(ax, widths) -> None:
    ax.set_xscale("log", base=2)
    _ticks_at(ax.xaxis, widths)
    ax.set_xlabel("width $N$")


def _ok(table: pd.DataFrame) -> pd.Series:
    return table.trained_ok.astype(bool) if "trained_ok" in table else pd.Series(True, index=table.index)


def _legend(ax, **kwargs) -> None:
    """A legend only where something is labelled (a smoke run may have nothing trained to show)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _failed_note(ax, count: int) -> None:
    if count:
        ax.plot([], [], **FAILED, label=f"failed run ({count})")


def learning_rates(lr: pd.DataFrame) -> plt.Figure:
    """Validation loss against the peak learning rate, one line per width; the kept rate circled."""
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.7, 3.4))
    colours = _palette(lr.width)
    for width, part in lr.groupby("width"):
        part = part.sort_values("lr")
        finite = part[np.isfinite(part.validation_loss)]
        ax.plot(finite.lr, finite.validation_loss, "o-", color=colours[width], label=f"$N = {width}$")
        chosen = part[part.chosen.astype(bool)]
        ax.plot(chosen.lr, chosen.validation_loss, "o", ms=12, mfc="none", mec=colours[width], mew=1.5)
        for row in part[~np.isfinite(part.validation_loss)].itertuples():
            ax.annotate("diverged", (row.lr, finite.validation_loss.max()), fontsize=8, color="0.4")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="validation loss (nats)")
    _legend(ax, title="kept: circled", ncols=2)
    return fig


def heldout_loss(runs: pd.DataFrame, value: str = "heldout_loss", bar: float | None = None,
                 bar_label: str = "bigram baseline") -> plt.Figure:
    """A final held-out score of every run against width (default: the loss), beside the bar it must clear.

    ``bar`` defaults to the run's ``baseline_loss``; pass ``value="test_accuracy"`` with
    ``bar=<floor>`` for a classifier's accuracy.
    """
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.7, 3.2))
    ok = _ok(runs)
    ax.plot(runs.width[ok], runs[value][ok], "o", color="C0", alpha=0.7, label="run")
    means = runs[ok].groupby("width")[value].mean()
    ax.plot(means.index, means.values, "-", color="C0", label="mean over seeds")
    ax.plot(runs.width[~ok], runs[value][~ok], "x", color="0.5", label=f"failed run ({(~ok).sum()})")
    if bar is None and "baseline_loss" in runs and len(runs):
        bar = runs.baseline_loss.iloc[0]
    if bar is not None:
        ax.axhline(bar, color="C3", ls="--", lw=1, label=bar_label)
    _width_axis(ax, runs.width)
    ax.set_ylabel({"heldout_loss": "held-out loss (nats)", "test_accuracy": "test accuracy"}.get(value, value))
    _legend(ax)
    return fig


def trajectory(geometry: pd.DataFrame, layer: str, value: str = "d_align") -> plt.Figure:
    """``value`` along training at ``layer``, one line per width (seed mean, band: seed range); pools side by side."""
    pools = [p for p in ("heldout", "train") if p in set(geometry.pool)]
    fig, axes = plt.subplots(1, len(pools), figsize=(COLUMN_WIDTH, 3.4), sharey=True, squeeze=False)
    at_layer = geometry[geometry.layer == layer].assign(x=lambda t: t.step.clip(lower=1))
    colours = _palette(geometry.width)
    for ax, pool in zip(axes[0], pools):
        part = at_layer[at_layer.pool == pool]
        ok = _ok(part)
        for (width, seed), run in part[~ok].groupby(["width", "seed"]):
            ax.plot(run.x, run[value].clip(lower=1e-8), **FAILED)
        for width, runs in part[ok].groupby("width"):
            stats = runs.groupby("x")[value].agg(["mean", "min", "max"])
            ax.plot(stats.index, stats["mean"], "o-", ms=3, color=colours[width], label=f"$N = {width}$")
            ax.fill_between(stats.index, stats["min"], stats["max"], color=colours[width], alpha=0.18, lw=0)
        _failed_note(ax, part[~ok].groupby(["width", "seed"]).ngroups)
        ax.set(xscale="log", yscale="log", title=f"{pool} pool", xlabel="training step (step 0 drawn at 1)")
    axes[0, 0].set_ylabel(f"{LABELS.get(value, value)} at {layer}")
    _legend(axes[0, -1], fontsize=8.5)
    return fig


def trend_along_training(trend: pd.DataFrame, layer: str, steps: int) -> plt.Figure:
    """Spearman ρ of width against d_align at each checkpoint, with its interval over seeds; last third shaded."""
    rows = trend[(trend.quantity == "d_align") & (trend.view == "matched_step") & (trend.layer == layer)]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.75, 3.2))
    ax.axvspan(2 * steps / 3, steps * 1.04, color="0.92", zorder=0, label="last third")
    for nudge, (pool, part) in zip((-0.008, 0.008), rows.groupby("pool")):  # linear steps: the last third stays legible
        ax.errorbar(part.step + nudge * steps, part.rho, yerr=[part.rho - part.rho_lo, part.rho_hi - part.rho],
                    fmt="o", capsize=3, label=f"{pool} pool")
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set(xlim=(-0.03 * steps, steps * 1.04), ylim=(-1.08, 1.08), xlabel="training step", ylabel=LABELS["rho"])
    _legend(ax, fontsize=8.5, loc="lower left")
    return fig


def matched_loss(trend: pd.DataFrame, geometry_at_levels: pd.DataFrame, layer: str) -> plt.Figure:
    """d_align against width with every run read where it first reaches each common held-out loss."""
    part = geometry_at_levels[(geometry_at_levels.layer == layer) & (geometry_at_levels.pool == "heldout")]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.75, 3.4))
    levels = sorted(part.loss_level.unique())
    colours = dict(zip(levels, sns.color_palette("rocket", len(levels) + 1)))
    for level in levels:
        runs = part[part.loss_level == level]
        ax.plot(runs.width, runs.d_align, "o", color=colours[level], alpha=0.45, ms=4)
        means = runs.groupby("width").d_align.mean()
        ax.plot(means.index, means.values, "-", color=colours[level], label=f"held-out loss ≤ {level:.2f}")
    _width_axis(ax, part.width if len(part) else [1])
    ax.set(yscale="log", ylabel=f"{LABELS['d_align']} at {layer}")
    _legend(ax, fontsize=8.5)
    return fig


def final_geometry(geometry: pd.DataFrame, layer: str, step: int) -> plt.Figure:
    """‖μ‖², d_∥, d_2 and d_align against width at one checkpoint, both pools, seed points with jackknife bars."""
    at_step = geometry[(geometry.step == step) & (geometry.layer == layer)]
    final, failed = at_step[_ok(at_step)], at_step[~_ok(at_step)]
    fig, axes = plt.subplots(2, 2, figsize=(COLUMN_WIDTH, 5.2), sharex=True)
    for ax, name in zip(axes.flat, ["mean_sq", "d_par", "d_2", "d_align"]):
        ax.plot(failed.width, failed[name], "x", color="0.6", label=f"failed run ({len(failed)} rows)" if len(
            failed) else None)
        for pool, colour, nudge in (("heldout", "C0", 0.96), ("train", "C1", 1.04)):
            part = final[final.pool == pool]
            lo = (part[name] - part[f"{name}_lo"]).clip(lower=0)
            hi = (part[f"{name}_hi"] - part[name]).clip(lower=0)
            ax.errorbar(part.width * nudge, part[name], yerr=[lo, hi], fmt="o", ms=3.5, color=colour, alpha=0.5,
                        lw=1)
            means = part.groupby("width")[name].mean()
            ax.plot(means.index, means.values, "-", color=colour, label=f"{pool} pool")
        positive = (at_step[name] > 0).all() and len(at_step)
        ax.set(yscale="log" if positive else "symlog", title=LABELS[name])
        if positive:  # labels at 1, 2, 5 x 10^k within a short range, decades otherwise; never minor labels
            span = at_step[name].max() / at_step[name].min()
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if span < 30 else (1.0,)))
            ax.yaxis.set_minor_formatter(NullFormatter())
        _width_axis(ax, geometry.width)
    for ax in axes[0]:
        ax.set_xlabel("")
    _legend(axes[0, 0], fontsize=8.5)
    return fig


def layers_heatmap(geometry: pd.DataFrame, step: int) -> plt.Figure:
    """Seed-mean d_align by insertion point and width (held-out pool) at one checkpoint."""
    part = geometry[(geometry.step == step) & (geometry.pool == "heldout") & _ok(geometry)]
    heat = part.groupby(["layer", "width"]).d_align.mean().unstack("width")
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 0.55 * max(len(heat), 1) + 1.6))
    if heat.empty:
        ax.text(0.5, 0.5, "no trained run", ha="center", va="center", color="0.5")
        ax.set_axis_off()
        return fig
    sns.heatmap(np.log10(heat.clip(lower=1e-12)), annot=heat.map(lambda v: f"{v:.2g}"), fmt="", cmap="mako",
                ax=ax, cbar_kws={"label": r"$\log_{10} d_{\mathrm{align}}$"})
    ax.set(xlabel="width $N$", ylabel="")
    return fig


def misalignment_by_width(misalignment: pd.DataFrame, M: int, K: int) -> plt.Figure:
    """Empirical misalignment (Wilson intervals) against width at one budget; B_exact, B_align where they apply."""
    fixed = misalignment[(misalignment.M == M) & (misalignment.K == K)]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 3.6))
    ok = _ok(fixed)
    for setting, marker in (("heldout/heldout", "o"), ("train/heldout", "s")):
        part = fixed[ok & (fixed.setting == setting)]
        stats = part.groupby("width")[["p_misalign", "p_misalign_lo", "p_misalign_hi"]].mean()
        ax.errorbar(stats.index, stats.p_misalign, fmt=f"{marker}-", capsize=3,
                    yerr=[stats.p_misalign - stats.p_misalign_lo, stats.p_misalign_hi - stats.p_misalign],
                    label=f"empirical, {setting}")
    bounds = fixed[ok & fixed.b_exact.notna()].groupby("width")[["b_exact", "b_align"]].mean()
    ax.plot(bounds.index, bounds.b_exact, "^--", color="C2", label=LABELS["b_exact"])
    ax.plot(bounds.index, bounds.b_align, "v--", color="C3", label=LABELS["b_align"])
    failed = fixed[~ok]
    ax.plot(failed.width, failed.p_misalign, "x", color="0.5", label=f"failed run ({failed.seed.nunique()} seeds)"
            if len(failed) else None)
    _width_axis(ax, misalignment.width)
    ax.set(ylim=(-0.02, 1.02), ylabel=LABELS["p_misalign"], title=f"$M = {M}$, $K = {K}$")
    _legend(ax, fontsize=8.5)
    return fig


def misalignment_by_budget(misalignment: pd.DataFrame) -> plt.Figure:
    """Empirical misalignment (held-out/held-out) against the budget M = K, one line per width."""
    part = misalignment[(misalignment.setting == "heldout/heldout") & (misalignment.M == misalignment.K)
                        & _ok(misalignment)]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.75, 3.4))
    colours = _palette(misalignment.width)
    for width, runs in part.groupby("width"):
        stats = runs.groupby("M").p_misalign.agg(["mean", "min", "max"])
        ax.plot(stats.index, stats["mean"], "o-", color=colours[width], label=f"$N = {width}$")
        ax.fill_between(stats.index, stats["min"], stats["max"], color=colours[width], alpha=0.15, lw=0)
    ax.set(xscale="log", xlabel="budget $M = K$", ylabel=LABELS["p_misalign"])
    _legend(ax, fontsize=8.5)
    return fig


def sample_unit(units: pd.DataFrame) -> plt.Figure:
    """d_align by sample unit and reduction against context length, one panel per width."""
    ok = units[_ok(units)].assign(choice=lambda t: t.unit + " / " + t.reduction)
    widths = sorted(units.width.unique())
    fig, axes = plt.subplots(1, max(len(widths), 1), figsize=(COLUMN_WIDTH, 3.0), sharey=True, squeeze=False)
    positive = ok.d_align[ok.d_align > 0]
    floor = positive.min() / 4 if len(positive) else 1e-6
    for ax, width in zip(axes[0], widths):
        for index, (choice, part) in enumerate(ok[ok.width == width].groupby("choice")):
            colour = f"C{index}"
            above = part[part.d_align > 0]
            ax.plot(above.context, above.d_align, "o-", color=colour, label=choice)
            zero = part[part.d_align <= 0]  # the unbiased ||mu||^4 estimate is not positive: the mean is lost in noise
            ax.plot(zero.context, [floor] * len(zero), "v", color=colour, mfc="none", ms=8,
                    label=r"$\leq 0$ (drawn at the floor)" if len(zero) else None)
        ax.set(xscale="log", yscale="log", title=f"$N = {width}$", xlabel="context $T$")
        _ticks_at(ax.xaxis, units.context)
        if ok[ok.width == width].empty:
            ax.text(0.5, 0.5, "failed run", transform=ax.transAxes, ha="center", color="0.5")
    axes[0, 0].set_ylabel(LABELS["d_align"])
    labelled = {}
    for ax in axes[0]:  # one legend entry per label across panels
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labelled.setdefault(label, handle)
    if labelled:
        fig.legend(labelled.values(), labelled.keys(), loc="outside lower center", ncols=4, fontsize=8.5)
    return fig
