"""Retention at small steps: how much of the first-order prediction a step keeps, on K and out of sample on E.

**Retention** (paper: at small steps the observed change kept 96-99 % of the predicted
one). Retention ``ΔL_K / (−η μ_Mᵀg_K)`` is read, as the paper reads it, on draws that
predict a decrease (``μ_Mᵀg_K > 0``) only, as a curve over δ (median over those draws and
the models). *Reproduced* when the median lies within 96-99 % at some δ and within 4 % of 1
at every smaller δ; *partly* when it is within 10 % of 1 at the smallest δ but never inside
96-99 % (the curvature along the step is negative, or the grid steps over the band); *not
reproduced* otherwise; *inconclusive* when no draw predicted a decrease. The verdict names
the δ where retention lies within 96-99 % and the first δ where first order breaks (beyond
10 %). That curve is Taylor's theorem on K and cannot fail; the claims table reads retention
*out of sample* (:func:`out_of_sample_retention`, :func:`out_of_sample_verdict`): ΔL_E over
the first-order prediction from g_K, at the smallest δ where first order holds on K.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from dalign_repro.report.describe.text import number
from dalign_repro.studies.interventions.draws import (PAPER_RETENTION, CLOSE_TO_ONE, FIRST_ORDER_TOLERANCE, column_or,
                                                     percent, percent_interval, family_name, steps_text, model_key,
                                                     percentile_interval, BOOTSTRAP_RESAMPLES, SETTING_NAMES)

__all__ = ["retention_curve", "retention_verdict", "describe_retention", "OUT_OF_SAMPLE_TOLERANCE",
           "out_of_sample_steps", "out_of_sample_retention", "out_of_sample_verdict", "describe_out_of_sample",
           "simulate_out_of_sample_verdict"]


def retention_curve(table: pd.DataFrame, kind: str = "bias") -> pd.DataFrame:
    """Per family and δ: the retention ``ΔL_K / (−η μ_Mᵀg_K)`` over the retention draws that predict a decrease
    (median, quartiles), with ``draws`` (those kept) of ``of`` (all draws at that δ)."""
    study = table[(table.study == "retention") & (table.kind == kind)] if len(table) else table
    rows = []
    for (family, step), group in (study.groupby(["family", "train_decrease"]) if len(study) else ()):
        kept = group[group.predicted < 0]
        rows.append({"family": family, "train_decrease": step, "median": kept.retention.median(),
                     "q25": kept.retention.quantile(0.25), "q75": kept.retention.quantile(0.75),
                     "draws": len(kept), "of": len(group)})
    return pd.DataFrame(rows)


def retention_verdict(table: pd.DataFrame, kind: str = "bias") -> dict[str, dict]:
    """Family → ``label``, ``band`` (the δ where the median retention lies within 96-99 %), ``breaks_at`` (the
    first δ where it leaves 1 by more than 10 %, NaN if never), ``smallest`` (δ, median) and ``draws``/``of``
    (draws predicting a decrease, of all); see the module docstring."""
    out = {}
    curve = retention_curve(table, kind)
    for family, part in (curve.groupby("family") if len(curve) else ()):
        part = part.sort_values("train_decrease")
        draws, of = int(part.draws.max()), int(part.of.max())
        facts = {"draws": draws, "of": of, "band": [], "breaks_at": math.nan, "smallest": (math.nan, math.nan)}
        if not draws:
            out[family] = {**facts, "label": "inconclusive"}
            continue
        steps, median = part.train_decrease.to_numpy(), part["median"].to_numpy()
        band = (median >= PAPER_RETENTION[0]) & (median <= PAPER_RETENTION[1])
        broken = np.abs(median - 1) > FIRST_ORDER_TOLERANCE
        close = np.abs(median - 1) <= CLOSE_TO_ONE
        facts.update(band=[float(s) for s in steps[band]], smallest=(float(steps[0]), float(median[0])),
                     breaks_at=float(steps[broken][0]) if broken.any() else math.nan)
        first = int(np.argmax(band)) if band.any() else -1
        if first >= 0 and close[:first].all():
            label = "reproduced"
        elif not broken[0]:
            label = "partly"
        else:
            label = "not reproduced"
        out[family] = {**facts, "label": label}
    return out


def describe_retention(table: pd.DataFrame, kind: str = "bias") -> str:
    """A sentence per family: the draws predicting a decrease, the δ where the median retention lies within the
    paper's 96-99 %, where first order breaks, and the same-sample label, named as Taylor's theorem's check (it
    cannot fail for a smooth loss; the claim is judged on E by :func:`out_of_sample_verdict`)."""
    lines = []
    for family, v in retention_verdict(table, kind).items():
        head = (f"- **{family_name(family)}**: {v['draws']} of {v['of']} retention draws predicted a decrease "
                f"($\\mu_M^\\top g_K > 0$)")
        if not v["draws"]:
            lines.append(head + ": no retention to read: **inconclusive**.")
            continue
        step, median = v["smallest"]
        band = (f"the median retention lies within {PAPER_RETENTION[0]:.0%}–{PAPER_RETENTION[1]:.0%} at "
                f"{steps_text(v['band'])} nats" if v["band"] else
                f"the median retention never lies within {PAPER_RETENTION[0]:.0%}–{PAPER_RETENTION[1]:.0%}")
        breaks = (f"first order breaks (beyond {FIRST_ORDER_TOLERANCE:.0%}) at δ = {number(v['breaks_at'])} nats"
                  if np.isfinite(v["breaks_at"]) else
                  f"first order holds within {FIRST_ORDER_TOLERANCE:.0%} over the whole grid")
        lines.append(f"{head}; at the smallest step (δ = {number(step)}) the median is {percent(median)}; {band}; "
                     f"{breaks}: on $K$, Taylor's theorem's check of the computation: {v['label']} (the paper's "
                     "claim is judged out of sample, on $E$).")
    return "\n".join(lines) if lines else "No trained model was intervened on at this profile."


OUT_OF_SAMPLE_TOLERANCE = FIRST_ORDER_TOLERANCE
"""Out-of-sample retention is judged against 1 ± this (the paper's 96–99% is stated beside it)."""


def out_of_sample_steps(table: pd.DataFrame, kind: str = "bias") -> pd.DataFrame:
    """Every step measured on E with a first-order prediction, as one frame: the retention study's steps where it
    measured E (``source = "retention"``, float64, the δ grid and the optimizer-step fractions) and the sign study's
    single steps (``source = "sign"``). Columns added: ``from_g`` = ΔL_E / (−η μ_Mᵀg_K) (the prediction from g_K),
    ``from_mu`` = ΔL_E / (−δ) (the prediction from μ_M alone, g_K = μ_M), ``same_sample`` = ΔL_K / (−η μ_Mᵀg_K)
    (Taylor's theorem); only draws that predict a decrease (μ_Mᵀg_K > 0) and whose change on E is measured."""
    if table.empty or "eval_observed" not in table:
        return table.iloc[0:0]
    steps = table[(table.kind == kind) & (column_or(table, "optimizer_steps", 0) == 0)
                  & table.eval_observed.notna() & ~column_or(table, "eval_tie", False).astype(bool)
                  & (table.predicted < 0)]
    steps = steps.assign(source=steps.study, step_fraction=column_or(steps, "step_fraction", math.nan))
    return steps.assign(from_g=steps.eval_observed / steps.predicted, from_mu=steps.eval_observed / -steps.train_decrease,
                        same_sample=steps.observed / steps.predicted)


def out_of_sample_retention(table: pd.DataFrame, kind: str = "bias", confidence: float = 0.95,
                            resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """Per family, source, setting and step (δ, or a fraction of an optimizer step): the median retention on E of
    the prediction from g_K (``from_g``) and from μ_M (``from_mu``) with percentile intervals over models resampled
    (:func:`sign_prediction`'s clusters), beside the same-sample median (Taylor's theorem), and ``draws``."""
    steps = out_of_sample_steps(table, kind)
    rows = []
    if steps.empty:
        return pd.DataFrame(rows)
    rng = np.random.default_rng(seed)
    # A δ of the grid is one step; a fraction of an optimizer step is one step whatever δ it came to in each draw.
    steps = steps.assign(cluster=model_key(steps), step_key=steps.step_fraction.fillna(-1.0),
                         delta_key=steps.train_decrease.where(steps.step_fraction.isna(), -1.0))
    for (family, source, setting, fraction, _), group in steps.groupby(
            ["family", "source", "setting", "step_key", "delta_key"]):
        row = {"family": family, "source": source, "setting": setting,
               "step_fraction": fraction if fraction >= 0 else math.nan,
               "train_decrease": float(group.train_decrease.median()), "draws": len(group),
               "models": group.cluster.nunique(), "same_sample": float(group.same_sample.median())}
        members = [g.index.to_numpy() for _, g in group.groupby("cluster")]
        for column in ("from_g", "from_mu"):
            values = group[column]
            boot = _cluster_medians([values.loc[m].to_numpy(float) for m in members], min(resamples, 1000), rng)
            lo, hi = percentile_interval(boot, confidence)
            row.update({column: float(values.median()), f"{column}_lo": lo, f"{column}_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def _cluster_medians(by_model: list[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The median of the values of ``len(by_model)`` models drawn with replacement, ``resamples`` times.

    The draws are the same as one ``rng.integers(0, m, m)`` per resample; the medians are taken at once over the
    resamples padded with NaN to one length (``nanmedian`` of a row is ``median`` of its values)."""
    picks = [rng.integers(0, len(by_model), len(by_model)) for _ in range(resamples)]
    sizes = np.array([len(v) for v in by_model])
    lengths = np.array([sizes[p].sum() for p in picks])
    padded = np.full((resamples, int(lengths.max()) if resamples else 0), np.nan)
    for row, pick in enumerate(picks):
        padded[row, :lengths[row]] = np.concatenate([by_model[i] for i in pick])
    return np.nanmedian(padded, axis=1) if resamples else np.array([])


def out_of_sample_verdict(curve: pd.DataFrame) -> dict[str, dict]:
    """Family → ``label``, ``reason`` and the row judged: retention on E of the prediction from g_K.

    Judged at the smallest step where first order still holds on K (same-sample median within 10% of 1: there
    curvature cannot explain a gap on E), on the retention study's float64 steps when they measured E, else on the
    sign study's train/held-out steps. *reproduced* when the interval of the median lies within 1 ± 10%,
    *contradicted* when it lies outside, *inconclusive* when it holds an edge; *not run* when no step on E is
    measured; *not estimable* when first order breaks on K at every step measured on E (the committed cpu table:
    E was measured only at δ ≥ 1e-3)."""
    out = {}
    for family, part in (curve.groupby("family") if len(curve) else ()):
        part = part[part.source == "retention"] if (part.source == "retention").any() else \
            part[part.setting == "train/heldout"]
        part = part[part.step_fraction.isna()].sort_values("train_decrease")
        holds = part[(part.same_sample - 1).abs() <= FIRST_ORDER_TOLERANCE]
        if part.empty:
            out[family] = {"label": "not run", "reason": "no step measured on E"}
            continue
        if holds.empty:
            first = part.iloc[0]
            out[family] = {"label": "not estimable", "reason": (
                f"E was measured only where first order already breaks on K (same-sample median "
                f"{percent(first.same_sample)} at δ = {number(first.train_decrease)}): a gap on E could be curvature"),
                "row": first.to_dict()}
            continue
        r = holds.iloc[0]
        lo, hi = 1 - OUT_OF_SAMPLE_TOLERANCE, 1 + OUT_OF_SAMPLE_TOLERANCE
        if lo <= r.from_g_lo and r.from_g_hi <= hi:
            label, reason = "reproduced", "the alignment on K predicts the change on E within 10%"
        elif r.from_g_hi < lo or r.from_g_lo > hi:
            label, reason = "contradicted", "the alignment on K does not predict the size of the change on E"
        else:
            label, reason = "inconclusive", "the interval holds an edge of 1 ± 10%"
        out[family] = {"label": label, "reason": reason, "row": r.to_dict()}
    return out


def describe_out_of_sample(curve: pd.DataFrame) -> str:
    """A sentence per family: the judged step, retention on E from g_K and from μ_M with intervals, beside the
    same-sample value (Taylor's theorem), and the verdict."""
    lines = []
    for family, v in out_of_sample_verdict(curve).items():
        r = v.get("row")
        if r is None:
            lines.append(f"- **{family_name(family)}**: **{v['label']}** ({v['reason']}).")
            continue
        where = ("the retention study (float64)" if r["source"] == "retention" else
                 f"the sign study's {SETTING_NAMES.get(r['setting'], r['setting'])} draws")
        lines.append(
            f"- **{family_name(family)}** at δ = {number(r['train_decrease'])} ({where}, {r['draws']} draws predicting a "
            f"decrease, {r['models']} models): on E the change kept {percent_interval(r['from_g'], r['from_g_lo'], r['from_g_hi'])} "
            f"of the prediction from $g_K$ and {percent_interval(r['from_mu'], r['from_mu_lo'], r['from_mu_hi'])} of that "
            f"from $\\mu_M$ alone; on K itself {percent(r['same_sample'])} (Taylor's theorem): **{v['label']}** "
            f"({v['reason']}).")
    return "\n".join(lines) if lines else "No step was measured on E at this profile."


def simulate_out_of_sample_verdict(draws_per_model: Sequence[int], retention: float, draw_sd: float = 0.3,
                                   model_sd: float = 0.05, trials: int = 100, seed: int = 0) -> dict[str, float]:
    """How often :func:`out_of_sample_verdict` gives each label when the models hold ``draws_per_model`` draws that
    predict a decrease (first order holding on K) and ΔL_E keeps ``retention`` of the prediction from g_K on
    average, each model off by N(0, ``model_sd``) and each draw by N(0, ``draw_sd``)."""
    rng = np.random.default_rng(seed)
    found = []
    for trial in range(trials):
        rows = []
        for m, n in enumerate(draws_per_model):
            kept = retention + rng.normal(0, model_sd) + rng.normal(0, draw_sd, n)
            predicted = -np.linspace(1e-6, 2e-6, n)
            rows.append(pd.DataFrame(dict(study="sign", family="f", model=f"m{m}", seed=0, setting="train/heldout",
                                          kind="bias", optimizer_steps=0, train_decrease=1e-5, predicted=predicted,
                                          observed=predicted, eval_observed=kept * predicted, eval_tie=False)))
        curve = out_of_sample_retention(pd.concat(rows, ignore_index=True), resamples=200, seed=trial)
        found.append(out_of_sample_verdict(curve)["f"]["label"])
    return {label: found.count(label) / trials for label in sorted(set(found))}


def out_of_sample_design(table: pd.DataFrame, verdicts: dict[str, dict], kind: str = "bias") -> dict[str, dict]:
    """Family → the design its out-of-sample verdict (``verdicts``, from :func:`out_of_sample_verdict`) read and the
    noise measured there: ``draws`` (draws predicting a decrease per model at the judged step), ``draw_sd`` (the
    spread of ΔL_E / prediction between draws of one model: 1.4826 × the median absolute deviation from the model's
    median, robust to the rare draw whose prediction is nearly 0) and ``model_sd`` (the spread of the models'
    medians, by the same rule)."""
    steps = out_of_sample_steps(table, kind)
    out = {}
    for family, v in verdicts.items():
        r = v.get("row")
        if r is None or v["label"] in ("not run", "not estimable"):
            continue
        judged = steps[(steps.family == family) & (steps.source == r["source"]) & (steps.setting == r["setting"])
                       & steps.step_fraction.isna() & np.isclose(steps.train_decrease, r["train_decrease"])]
        by_model = judged.assign(cluster=model_key(judged)).groupby("cluster").from_g
        medians = by_model.median()
        deviations = (judged.from_g - by_model.transform("median")).abs()
        out[family] = {"draws": by_model.size().tolist(), "draw_sd": 1.4826 * float(deviations.median()),
                       "model_sd": 1.4826 * float((medians - medians.median()).abs().median())}
    return out


def describe_out_of_sample_calibration(table: pd.DataFrame, curve: pd.DataFrame, kind: str = "bias",
                                       trials: int = 40) -> str:
    """A sentence per family: how often :func:`out_of_sample_verdict` says *reproduced* at the committed design
    (its draws per model) and the noise measured here (:func:`out_of_sample_design`) when ΔL_E keeps 100% of the
    prediction from g_K, and how often it says *reproduced* or *contradicted* when it keeps 50% or none.
    ``curve``: :func:`out_of_sample_retention` of ``table``, whose verdicts the sentence reads."""
    verdicts = out_of_sample_verdict(curve)
    design = out_of_sample_design(table, verdicts, kind)
    if not design:
        return "No family's retention was judged on $E$: the out-of-sample rule's power is not simulated."
    labels = {family: v["label"] for family, v in verdicts.items()}
    lines = []
    for family, d in design.items():
        found = {kept: simulate_out_of_sample_verdict(d["draws"], kept, draw_sd=d["draw_sd"], model_sd=d["model_sd"],
                                                      trials=trials) for kept in (1.0, 0.5, 0.0)}
        power, false_alarm = found[1.0].get("reproduced", 0), found[1.0].get("contradicted", 0)
        reading = {"inconclusive": (": at this noise the rule can reject a retention far from 1 but rarely confirm one "
                                    "near it, so the *inconclusive* here says the design is too small, not that "
                                    "retention is off") if power < 0.5 else "",
                   "contradicted": f": a true 100% reads *contradicted* in {false_alarm:.0%} of the tables, so the "
                                   f"*contradicted* here stands" if false_alarm <= 0.05 else
                                   f": a true 100% reads *contradicted* in {false_alarm:.0%} of the tables, too "
                                   "often for the *contradicted* here to stand alone"}.get(labels.get(family), "")
        lines.append(
            f"- **{family_name(family)}** ({sum(d['draws'])} draws in {len(d['draws'])} models; spread between draws "
            f"{d['draw_sd']:.2f}, between models {d['model_sd']:.2f}): when the change on $E$ keeps 100% of the "
            f"prediction it says *reproduced* in {power:.0%} (*contradicted* in {false_alarm:.0%}); when it keeps "
            f"50%, *reproduced* in {found[0.5].get('reproduced', 0):.0%} and *contradicted* in "
            f"{found[0.5].get('contradicted', 0):.0%}; when it keeps none, *contradicted* in "
            f"{found[0.0].get('contradicted', 0):.0%}{reading}.")
    return (f"**What the out-of-sample rule can tell at this design** ({trials} simulated tables per case, with each "
            "family's draws per model and the noise measured here):\n" + "\n".join(lines))
