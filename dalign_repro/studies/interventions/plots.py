"""Figures of the interventions chapter, drawn for the book's column with :func:`dalign_repro.report.plots.style`.

Each function takes ``interventions.csv`` (or a frame
:mod:`dalign_repro.studies.interventions` derives from it) and returns one Figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import LogLocator

from dalign_repro.studies.interventions.draws import FAMILY_NAMES, PAPER_RETENTION
from dalign_repro.studies.interventions.retention import retention_curve
from dalign_repro.report.figure_style import COLUMN_WIDTH, empty, legend_below, log_ticks

__all__ = ["retention_curves", "conditional_by_step", "curvature_check", "rates_beside_certificates", "headline"]

KIND_NAMES = {"bias": "shared bias", "block": "zero-output block"}


def _family_colors(families) -> dict:
    families = sorted(set(families))
    return dict(zip(families, sns.color_palette("colorblind", len(families))))


def retention_curves(table: pd.DataFrame, low: float = -0.5) -> plt.Figure:
    """Retention (observed / predicted on K) against the step δ over the draws that predict a decrease: the median
    per family with its middle half shaded; a panel per insertion.

    The paper's 96-99 % band is shaded grey; medians below ``low`` (curvature has long
    taken over) sit on the panel's floor.
    """
    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH, 3.3), sharey=True)
    curves = {kind: retention_curve(table, kind) for kind in ("bias", "block")}
    if all(c.empty or not c.draws.any() for c in curves.values()):
        for ax in axes:
            empty(ax, "no draw predicted a decrease")
        return fig
    colors = _family_colors(pd.concat(curves.values()).family)
    for ax, kind in zip(axes, ("bias", "block")):
        ax.axhspan(*PAPER_RETENTION, color="0.85", zorder=0, label="paper: 96–99%")
        ax.axhline(1.0, color="0.4", lw=0.8)
        for family, curve in (curves[kind].groupby("family") if len(curves[kind]) else ()):
            curve = curve[curve.draws > 0].sort_values("train_decrease")
            ax.fill_between(curve.train_decrease, curve.q25.clip(lower=low), curve.q75.clip(lower=low),
                            color=colors[family], alpha=0.2, lw=0)
            ax.plot(curve.train_decrease, curve["median"].clip(lower=low), marker="o", ms=3, lw=1.2,
                    color=colors[family], label=FAMILY_NAMES.get(family, family))
        ax.set_xscale("log")
        if len(curves[kind]):
            log_ticks(ax.xaxis, curves[kind].train_decrease, numticks=4)  # half a column: every other decade
        ax.set_ylim(low, 1.5)
        ax.set_title(KIND_NAMES[kind])
        # short: two panels share a column, and the legend sits below them (the step is the train-loss decrease)
        ax.set_xlabel(r"step $\delta$ (nats)")
    axes[0].set_ylabel("retention on K (Taylor's theorem)\n" r"$\Delta L_K / (-\eta\,\langle G_M, G_K\rangle)$")
    legend_below(fig, axes, ncols=2)
    return fig


def conditional_by_step(cond: pd.DataFrame, kind: str = "bias") -> plt.Figure:
    """P(ΔL_E < 0 | μ_Mᵀg_K > 0) (filled) and P(ΔL_E < 0 | μ_Mᵀg_K ≤ 0) (open) with Wilson intervals, along the
    single steps δ and the optimizer steps, per family (``cond``: :func:`conditional_decrease`)."""
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.3))
    part = cond[cond.kind == kind] if len(cond) else cond
    if part.empty:
        empty(ax, "no draw")
        return fig
    single = sorted(part[part.optimizer_steps == 0].train_decrease.unique())
    trained = sorted(part[part.optimizer_steps > 0].optimizer_steps.unique())
    labels = [f"δ={d:g}" for d in single] + [f"{n} steps" for n in trained]
    position = {("single", d): i for i, d in enumerate(single)}
    position.update({("trained", n): len(single) + i for i, n in enumerate(trained)})
    colors = _family_colors(part.family)
    families = sorted(part.family.unique())
    offsets = np.linspace(-0.15, 0.15, len(families)) if len(families) > 1 else [0.0]
    for offset, family in zip(offsets, families):
        rows = part[part.family == family]
        x = np.array([position[("trained", r.optimizer_steps) if r.optimizer_steps else ("single", r.train_decrease)]
                      for r in rows.itertuples()]) + offset
        for name, fill, shift in (("pos", colors[family], 0.0), ("nonpos", "none", 0.06)):
            p, lo, hi = rows[f"p_{name}"], rows[f"p_{name}_lo"], rows[f"p_{name}_hi"]
            ax.errorbar(x + shift, p, yerr=[p - lo, hi - p], fmt="o", mfc=fill, color=colors[family], capsize=3,
                        label=f"{FAMILY_NAMES.get(family, family)}, " + (r"$\mu_M^\top g_K > 0$" if name == "pos"
                                                                         else r"$\leq 0$"))
    ax.axhline(0.5, color="0.5", lw=0.8, ls=":")
    ax.axvline(len(single) - 0.5, color="0.7", lw=0.8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylim(-0.02, 1.05)
    ax.set_ylabel(r"share with $\Delta L_E < 0$")
    legend_below(fig, ax, ncols=2)
    return fig


def curvature_check(table: pd.DataFrame) -> plt.Figure:
    """|observed − predicted| against the exact curvature term |½η²uᵀH_K u|.

    On the diagonal, second order explains the departure from first order."""
    study = table[(table.study == "retention")] if len(table) else table
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 3.6))
    gap, curve = (study.observed - study.predicted).abs(), study.second_order.abs()
    keep = (gap > 0) & (curve > 0) if len(study) else []
    if not len(study) or not keep.any():
        empty(ax, "no trained model")
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
    for axis in (ax.xaxis, ax.yaxis):  # a dozen decades: every third one labelled, readable on a phone
        axis.set_major_locator(LogLocator(base=10, numticks=6))
    ax.set_xlabel(r"$|\frac{1}{2}\eta^2 u^\top H_K u|$ (nats)")
    ax.set_ylabel(r"$|\Delta L_K - \mathrm{predicted}|$ (nats)")
    legend_below(fig, ax, ncols=2)
    return fig


def rates_beside_certificates(frame: pd.DataFrame) -> plt.Figure:
    """The share of draws with μ_Mᵀg_K > 0 (with its interval) against the lower bound 1 − B_align it must clear, per
    held-out/held-out cell (where the bound applies): the certificate holds where a point is on or above the
    diagonal. One panel, for a phone's column."""
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, 3.6))
    covered = frame[frame.setting == "heldout/heldout"].dropna(subset=["b_align"]) if len(frame) else frame
    if covered.empty:
        empty(ax, "no held-out/held-out cell")
        return fig
    colors = _family_colors(covered.family)
    for family, part in covered.groupby("family"):
        ax.errorbar(part.one_minus_b_align, part.share_positive,
                    yerr=[part.share_positive - part.share_positive_lo, part.share_positive_hi - part.share_positive],
                    fmt="o", color=colors[family], capsize=2, label=FAMILY_NAMES.get(family, family))
    ax.plot([0, 1], [0, 1], color="0.3", lw=0.8, ls="--", label="the bound")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(r"$1 - B_{\mathrm{align}}$")
    ax.set_ylabel(r"share with $\mu_M^\top g_K > 0$")
    legend_below(fig, ax, ncols=2)
    return fig


def headline(verdicts: dict[str, dict], prediction: pd.DataFrame, low: float = -0.5, high: float = 1.5
             ) -> plt.Figure:
    """The chapter's answer in one figure, two panels stacked for a phone's column.

    Top: per family, the retention on E of the prediction from g_K at the judged step (``verdicts``:
    :func:`~dalign_repro.studies.interventions.retention.out_of_sample_verdict`), with its interval over models,
    beside the same-sample value on K (Taylor's theorem), against 1 ± 10% and the paper's 96-99%. Bottom: per
    family and setting (``prediction``: :func:`~dalign_repro.studies.interventions.prediction.sign_prediction`),
    P(ΔL_E < 0 | μ_Mᵀg_K > 0) (filled) and P(ΔL_E < 0 | ≤ 0) (open) with their intervals, against the rule's 80%
    and 95%."""
    from dalign_repro.studies.interventions.draws import FIRST_ORDER_TOLERANCE, SETTING_NAMES, SIGN_BANDS

    rows = [(family, v["row"]) for family, v in verdicts.items() if v.get("row") is not None]
    groups = len(prediction) if len(prediction) else 1
    fig, axes = plt.subplots(2, 1, figsize=(COLUMN_WIDTH, 2.4 + 0.5 * (max(len(rows), 1) + groups)),
                             gridspec_kw={"height_ratios": [max(len(rows), 1) + 0.8, groups + 0.8]})
    top, bottom = axes
    colors = _family_colors(list(verdicts) + (list(prediction.family) if len(prediction) else []))
    top.axvspan(1 - FIRST_ORDER_TOLERANCE, 1 + FIRST_ORDER_TOLERANCE, color="0.92", zorder=0, label="1 ± 10%")
    top.axvspan(*PAPER_RETENTION, color="0.75", zorder=0, label="paper: 96–99%")
    if not rows:
        empty(top, "no step measured on E")
    for y, (family, r) in enumerate(rows):
        value, lo, hi = (float(np.clip(r[c], low, high)) for c in ("from_g", "from_g_lo", "from_g_hi"))
        top.errorbar([value], [y], xerr=[[value - lo], [hi - value]], fmt="o", color=colors[family], capsize=3,
                     label="on E (fresh examples)" if y == 0 else None)
        top.scatter([np.clip(r["same_sample"], low, high)], [y], marker="x", color="0.3", zorder=3,
                    label="on K (Taylor's theorem)" if y == 0 else None)
    top.set_yticks(range(len(rows)), [FAMILY_NAMES.get(f, f) for f, _ in rows])
    top.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # one empty row where none was measured (equal limits warn)
    top.set_xlim(low, high)
    top.set_xticks(np.arange(np.ceil(low * 2) / 2, high + 1e-9, 0.5))
    top.set_xlabel("retention: change / first-order prediction")
    if prediction.empty:
        empty(bottom, "no sign draw")
    else:
        for band in (SIGN_BANDS["partly"], SIGN_BANDS["reproduced"]):
            bottom.axvline(band, color="0.5", lw=0.8, ls=":")
        for y, r in enumerate(prediction.itertuples()):
            for name, fill, shift in (("pos", colors[r.family], -0.12), ("nonpos", "white", 0.12)):
                p, lo, hi = getattr(r, f"p_{name}"), getattr(r, f"p_{name}_lo"), getattr(r, f"p_{name}_hi")
                if not np.isfinite(p):
                    continue
                bottom.errorbar([p], [y + shift], xerr=[[p - lo], [hi - p]], fmt="o", mfc=fill,
                                color=colors[r.family], capsize=2,
                                label=(r"$\mu_M^\top g_K > 0$" if name == "pos" else r"$\mu_M^\top g_K \leq 0$")
                                if y == 0 else None)
        bottom.set_yticks(range(len(prediction)), [f"{FAMILY_NAMES.get(r.family, r.family)},\n"
                                                   f"{SETTING_NAMES.get(r.setting, r.setting)}"
                                                   for r in prediction.itertuples()])
        bottom.set_ylim(len(prediction) - 0.5, -0.5)
        bottom.set_xlim(-0.02, 1.02)
    bottom.set_xlabel(r"share of steps that lowered $L_E$")
    legend_below(fig, axes, ncols=2)
    return fig

