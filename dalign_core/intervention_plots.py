"""Figures of the interventions chapter, drawn for the book's column with :func:`dalign_core.plots.style`.

Each function takes ``interventions.csv`` (or a frame
:mod:`dalign_core.intervention_report` derives from it) and returns one Figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from dalign_core.intervention_report import FAMILY_NAMES, PAPER_RETENTION, Z_BINS
from dalign_core.plots import COLUMN_WIDTH, _empty, _legend_below, log_ticks

__all__ = ["retention_curves", "curvature_check", "sign_by_size", "rates_beside_certificates"]

KIND_NAMES = {"bias": "shared bias", "block": "zero-output block"}


def _family_colors(families) -> dict:
    families = sorted(set(families))
    return dict(zip(families, sns.color_palette("colorblind", len(families))))


def retention_curves(table: pd.DataFrame, low: float = -0.5) -> plt.Figure:
    """Retention (observed / predicted) against the step δ, one line per model; a panel per insertion.

    The paper's 96-99 % band is shaded; retentions below ``low`` (curvature has long
    taken over) sit on the panel's floor.
    """
    study = table[table.study == "retention"] if len(table) else table
    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH, 3.3), sharey=True)
    if study.empty:
        for ax in axes:
            _empty(ax, "no trained model")
        return fig
    colors = _family_colors(study.family)
    for ax, kind in zip(axes, ("bias", "block")):
        ax.axhspan(*PAPER_RETENTION, color="0.85", zorder=0, label="paper: 96–99%")
        ax.axhline(1.0, color="0.4", lw=0.8)
        for (family, model), curve in study[study.kind == kind].groupby(["family", "model"]):
            curve = curve.sort_values("train_decrease")
            ax.plot(curve.train_decrease, curve.retention.clip(lower=low), marker="o", ms=3, lw=1.2,
                    color=colors[family], alpha=0.8, label=FAMILY_NAMES.get(family, family))
        ax.set_xscale("log")
        log_ticks(ax.xaxis, study.train_decrease)
        ax.set_ylim(low, 1.5)
        ax.set_title(KIND_NAMES[kind])
        ax.set_xlabel(r"step $\delta$ (train-loss decrease, nats)")
    axes[0].set_ylabel(r"retention $\Delta L_K / (-\eta\,\langle G_M, G_K\rangle)$")
    _legend_below(fig, axes, ncols=4)
    return fig


def curvature_check(table: pd.DataFrame) -> plt.Figure:
    """|observed − predicted| against the exact curvature term |½η²uᵀH_K u|.

    On the diagonal, second order explains the departure from first order."""
    study = table[(table.study == "retention")] if len(table) else table
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.62, 3.4))
    gap, curve = (study.observed - study.predicted).abs(), study.second_order.abs()
    keep = (gap > 0) & (curve > 0) if len(study) else []
    if not len(study) or not keep.any():
        _empty(ax, "no trained model")
        return fig
    colors = _family_colors(study.family)
    for (family, kind), part in study[keep].groupby(["family", "kind"]):
        ax.scatter(curve[part.index], gap[part.index], s=14, color=colors[family],
                   marker="o" if kind == "bias" else "^", alpha=0.8,
                   label=f"{FAMILY_NAMES.get(family, family)}, {KIND_NAMES[kind]}")
    span = [min(curve[keep].min(), gap[keep].min()), max(curve[keep].max(), gap[keep].max())]
    ax.plot(span, span, color="0.3", lw=0.8, ls="--", label="equal")
    ax.set_xscale("log")
    ax.set_yscale("log")
    log_ticks(ax.xaxis, span)
    log_ticks(ax.yaxis, span)
    ax.set_xlabel(r"$|\frac{1}{2}\eta^2 u^\top H_K u|$ (nats)")
    ax.set_ylabel(r"$|\Delta L_K - \mathrm{predicted}|$ (nats)")
    _legend_below(fig, ax, ncols=2)
    return fig


def sign_by_size(agreement: pd.DataFrame) -> plt.Figure:
    """Sign agreement against the size of the statistic, ``|μ_Mᵀg_K| / sd``, per family (Wilson intervals)."""
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.2))
    bins = [b for b in agreement.z_bin.unique() if b != "all"] if len(agreement) else []
    if not bins:
        _empty(ax, "no draw")
        return fig
    order = [str(pd.Interval(lo, hi, closed="left")) for lo, hi in zip(Z_BINS[:-1], Z_BINS[1:])]
    order = [b for b in order if b in bins]
    colors = _family_colors(agreement.family)
    families = sorted(agreement.family.unique())
    offsets = np.linspace(-0.2, 0.2, len(families)) if len(families) > 1 else [0.0]
    for offset, family in zip(offsets, families):
        part = agreement[(agreement.family == family) & (agreement.z_bin != "all")].set_index("z_bin").reindex(order)
        x = np.arange(len(order)) + offset
        ax.errorbar(x, part.agree, yerr=[part.agree - part.agree_lo, part.agree_hi - part.agree], fmt="o",
                    color=colors[family], capsize=3, label=FAMILY_NAMES.get(family, family))
    ax.axhline(0.5, color="0.5", lw=0.8, ls=":", label="a coin")
    labels = [b.replace("inf", r"\infty").replace("[", "$[").replace(")", ")$") for b in order]
    ax.set_xticks(range(len(order)), labels)
    ax.set_xlabel(r"$|\mu_M^\top g_K|$ / its standard deviation over draws")
    ax.set_ylabel("sign agreement")
    ax.set_ylim(0, 1.05)
    _legend_below(fig, ax, ncols=4)
    return fig


def rates_beside_certificates(frame: pd.DataFrame) -> plt.Figure:
    """Left: how often the step raised the held-out loss against how often μ_Mᵀg_K ≤ 0. Right: the certificates
    B_exact and B_align against that misalignment rate (held-out/held-out draws, where they apply)."""
    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH, 3.4))
    if frame.empty:
        for ax in axes:
            _empty(ax, "no draw")
        return fig
    colors = _family_colors(frame.family)
    for (family, setting), part in frame.groupby(["family", "setting"]):
        filled = setting == "heldout/heldout"
        axes[0].scatter(part.p_misaligned, part.p_raised, s=22, color=colors[family] if filled else "none",
                        edgecolors=colors[family], label=f"{FAMILY_NAMES.get(family, family)}, {setting}")
    covered = frame[frame.setting == "heldout/heldout"].dropna(subset=["b_exact"])
    for name, marker in (("b_exact", "o"), ("b_align", "s")):
        for family, part in covered.groupby("family"):
            axes[1].scatter(part.p_misaligned, part[name], s=22, marker=marker, color=colors[family], alpha=0.8,
                            label=rf"$B_{{\mathrm{{{name[2:]}}}}}$" if family == covered.family.min() else None)
    for ax in axes:
        ax.plot([0, 1], [0, 1], color="0.3", lw=0.8, ls="--")
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(r"share of draws with $\mu_M^\top g_K \leq 0$")
    axes[0].set_ylabel("share of steps that raised $L_K$")
    axes[1].set_ylabel("certificate")
    axes[0].legend(fontsize=8.5, loc="upper left")
    if len(covered):
        axes[1].legend(loc="lower right")
    return fig
