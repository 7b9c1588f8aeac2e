"""The sign as a prediction: does μ_Mᵀg_K > 0 tell a fall on E from a rise better than chance?

**The sign as a prediction** (:func:`sign_prediction`, the claims table's rule): per family
and setting, P(ΔL_E < 0 | μ_Mᵀg_K > 0), P(ΔL_E < 0 | ≤ 0), their difference and the AUC of
μ_Mᵀg_K for a fall, with intervals that resample models; the sign predicts only where the
difference lies above 0 (:func:`prediction_label`). :func:`simulate_prediction_verdict` runs
the rule at a design.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dalign_core.geometry.misalignment import wilson_interval
from dalign_repro.studies.interventions.draws import (SIGN_BANDS, wilson_rate, measured_changes, judged_steps,
                                                     percent_interval, family_name, model_key, percentile_interval,
                                                     BOOTSTRAP_RESAMPLES, SETTING_NAMES)

__all__ = ["PREDICTION_MARGIN", "auc_text", "prediction_label", "sign_prediction", "prediction_design",
           "simulate_prediction_verdict", "describe_prediction", "describe_prediction_calibration"]


PREDICTION_MARGIN = 0.10
"""A difference P(fall | > 0) − P(fall | ≤ 0) whose interval lies below this says the sign adds less than 10 points:
the step along μ_M helps (or not) whatever its alignment."""


def _auc(score: np.ndarray, fell: np.ndarray) -> float:
    """Area under the ROC curve of ``score`` for ``fell`` (Mann-Whitney, ties count one half); NaN without both."""
    pos, neg = score[fell], score[~fell]
    if not len(pos) or not len(neg):
        return math.nan
    ranks = pd.Series(np.concatenate([pos, neg])).rank().to_numpy()
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def auc_text(auc: float, lo: float, hi: float, score: str = "AUC") -> str:
    """``score`` with its interval, or why it is undefined: the AUC needs draws that fell and draws that did not."""
    if not np.isfinite(auc):
        return f"{score} undefined (every draw lowered the loss on E, or none did)"
    return f"{score} {auc:.2f} [{lo:.2f}, {hi:.2f}]"


def _newcombe(k1: int, n1: int, k2: int, n2: int, confidence: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval of p1 − p2 from two Wilson intervals (independent draws); NaN if n = 0."""
    if not n1 or not n2:
        return math.nan, math.nan
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, confidence)
    l2, u2 = wilson_interval(k2, n2, confidence)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _union(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """The smallest interval holding both (NaN ends ignored; NaN when both are)."""
    lows, highs = [v for v in (a[0], b[0]) if np.isfinite(v)], [v for v in (a[1], b[1]) if np.isfinite(v)]
    return (min(lows) if lows else math.nan), (max(highs) if highs else math.nan)


def _cluster_counts(kept: pd.DataFrame, change: pd.Series) -> pd.DataFrame:
    """Per model: falls and draws with positive alignment (``k_pos, n_pos``) and with ≤ 0 (``k_non, n_non``)."""
    frame = pd.DataFrame({"cluster": model_key(kept), "pos": kept.alignment > 0, "fell": change < 0})
    frame["k_pos"], frame["n_pos"] = frame.fell & frame.pos, frame.pos
    frame["k_non"], frame["n_non"] = frame.fell & ~frame.pos, ~frame.pos
    return frame.groupby("cluster")[["k_pos", "n_pos", "k_non", "n_non"]].sum().astype(float)


def _bootstrap_rates(counts: pd.DataFrame, resamples: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """P(fall | > 0) and P(fall | ≤ 0) in ``resamples`` resamples of the models (with replacement)."""
    pick = rng.integers(0, len(counts), size=(resamples, len(counts)))
    sums = counts.to_numpy()[pick].sum(1)  # (resamples, 4)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums[:, 0] / sums[:, 1], sums[:, 2] / sums[:, 3]


def prediction_label(p_pos: float, p_lo: float, p_hi: float, d_lo: float, d_hi: float) -> tuple[str, str]:
    """The sign claim as a prediction, from P(fall | > 0) with its interval and the difference's interval.

    * the first conditional's interval holds both 80% and 95%, or it is below 80% with an interval reaching 80%:
      ``inconclusive``; below 80% with the interval below too: ``contradicted``;
    * the difference's interval above 0: the first conditional's own label (``reproduced`` at ≥ 95%, ``partly``);
    * its interval below :data:`PREDICTION_MARGIN`: ``partly`` (a step along μ_M helps whatever its alignment);
    * its interval holding both 0 and the margin: ``inconclusive``.

    Returns (label, the reason in words)."""
    if not (np.isfinite(p_pos) and np.isfinite(p_lo) and np.isfinite(p_hi)):
        return "not estimable", "no draw with positive alignment"
    high, low = SIGN_BANDS["reproduced"], SIGN_BANDS["partly"]
    if p_lo < low <= high <= p_hi:
        return "inconclusive", f"the interval of P(fall | > 0) holds both {low:.0%} and {high:.0%}"
    if p_pos < low:
        return (("contradicted", f"P(fall | > 0) lies below {low:.0%}") if p_hi < low else
                ("inconclusive", f"P(fall | > 0) is below {low:.0%} but its interval reaches it"))
    level = "reproduced" if p_pos >= high else "partly"
    if not (np.isfinite(d_lo) and np.isfinite(d_hi)):
        return "inconclusive", "no draw with alignment ≤ 0: the difference is not measured"
    if d_lo > 0:
        return level, "positive alignment lowers the loss more often than non-positive alignment does"
    if d_hi < PREDICTION_MARGIN:
        return "partly", "a step along μ_M helps whatever its alignment (the sign adds less than " \
                         f"{PREDICTION_MARGIN:.0%})"
    return "inconclusive", f"the difference's interval holds both 0 and {PREDICTION_MARGIN:.0%}"


def sign_prediction(table: pd.DataFrame, step: float, kind: str = "bias", by: tuple[str, ...] = ("family", "setting"),
                    on: str = "eval", confidence: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                    auc: bool = True) -> pd.DataFrame:
    """Per group (default: family and setting) at the single step ``step``: the sign of μ_Mᵀg_K as a prediction of a
    fall of the loss on E.

    Columns: ``p_pos`` = P(ΔL_E < 0 | μ_Mᵀg_K > 0), ``p_nonpos`` = P(ΔL_E < 0 | ≤ 0), ``difference`` (their
    difference) and ``auc`` (area under the ROC curve of μ_Mᵀg_K for a fall), each with ``_lo``/``_hi``; ``n_pos``,
    ``n_nonpos``, ``models``, ``ties``; ``label`` and ``reason`` (:func:`prediction_label`). Draws share models,
    layers and E, so each interval is a percentile bootstrap that resamples models (``resamples`` times), widened to
    hold the interval of independent draws (Wilson for a rate, Newcombe for the difference), which a bootstrap over
    few models can understate."""
    rows = []
    judged = judged_steps(table, step, kind)
    if judged.empty:
        return pd.DataFrame(rows)
    rng = np.random.default_rng(seed)
    for keys, group in judged.groupby(list(by)):
        keys = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)))
        kept, change, ties = measured_changes(group, on)
        counts = _cluster_counts(kept, change)
        k_pos, n_pos, k_non, n_non = (int(v) for v in counts.sum())
        p_pos = k_pos / n_pos if n_pos else math.nan
        p_non = k_non / n_non if n_non else math.nan
        boot_pos, boot_non = _bootstrap_rates(counts, resamples, rng)
        pos_ci = _union(percentile_interval(boot_pos, confidence), wilson_rate(k_pos, n_pos, confidence)[1:])
        non_ci = _union(percentile_interval(boot_non, confidence), wilson_rate(k_non, n_non, confidence)[1:])
        diff_ci = _union(percentile_interval(boot_pos - boot_non, confidence), _newcombe(k_pos, n_pos, k_non, n_non,
                                                                                 confidence))
        row = {**keys, "models": len(counts), "draws": len(group), "ties": ties,
               "p_pos": p_pos, "p_pos_lo": pos_ci[0], "p_pos_hi": pos_ci[1], "n_pos": n_pos,
               "p_nonpos": p_non, "p_nonpos_lo": non_ci[0], "p_nonpos_hi": non_ci[1], "n_nonpos": n_non,
               "difference": p_pos - p_non, "difference_lo": diff_ci[0], "difference_hi": diff_ci[1]}
        if auc:
            score, fell, cluster = kept.alignment.to_numpy(float), (change < 0).to_numpy(), model_key(kept).to_numpy()
            names = np.unique(cluster)
            members = [np.flatnonzero(cluster == c) for c in names]
            boot = [_auc(score[idx], fell[idx]) for idx in
                    (np.concatenate([members[i] for i in rng.integers(0, len(names), len(names))])
                     for _ in range(min(resamples, 1000)))]
            row.update(auc=_auc(score, fell), **dict(zip(("auc_lo", "auc_hi"), percentile_interval(np.array(boot),
                                                                                            confidence))))
        row["label"], row["reason"] = prediction_label(p_pos, pos_ci[0], pos_ci[1], *diff_ci)
        rows.append(row)
    return pd.DataFrame(rows)


def prediction_design(table: pd.DataFrame, step: float, kind: str = "bias") -> pd.DataFrame:
    """The design of :func:`sign_prediction`: per family, setting, model and layer, the draws with positive and
    with non-positive alignment whose change on E is measured (``n_pos``, ``n_nonpos``)."""
    kept, _, _ = measured_changes(judged_steps(table, step, kind), "eval")
    if kept.empty:
        return pd.DataFrame(columns=["family", "setting", "model", "seed", "layer", "n_pos", "n_nonpos"])
    kept = kept.assign(model=model_key(kept), pos=kept.alignment > 0)
    return (kept.groupby(["family", "setting", "model", "seed", "layer"])
            .pos.agg(n_pos="sum", n_nonpos=lambda p: int((~p).sum())).reset_index())


def simulate_prediction_verdict(design: pd.DataFrame, p_pos: float, p_nonpos: float, spread: float = 10.0,
                                trials: int = 100, seed: int = 0, resamples: int = 500) -> dict[str, float]:
    """How often :func:`sign_prediction` gives each label at ``design`` (a :func:`prediction_design` table) when a
    share ``p_pos`` of the positive draws and ``p_nonpos`` of the others lower the loss on E. Each (model, layer)
    cell draws its own two rates from Beta(rate·``spread``, (1 − rate)·``spread``), as in
    :func:`simulate_sign_verdict`. Returns label → share over the trials and the (family, setting) groups."""
    rng = np.random.default_rng(seed)
    found: list[str] = []

    def cell_rates(rate: float) -> np.ndarray:
        if rate <= 0 or rate >= 1:
            return np.full(len(design), rate)
        return rng.beta(rate * spread, (1 - rate) * spread, size=len(design))

    n_pos, n_non = design.n_pos.to_numpy(int), design.n_nonpos.to_numpy(int)
    for trial in range(trials):
        r_pos, r_non = np.repeat(cell_rates(p_pos), n_pos), np.repeat(cell_rates(p_nonpos), n_non)
        fell = np.concatenate([rng.random(len(r_pos)) < r_pos, rng.random(len(r_non)) < r_non])
        frame = pd.DataFrame(dict(
            study="sign", kind="bias", train_decrease=1.0, optimizer_steps=0, eval_tie=False,
            family=np.concatenate([np.repeat(design.family.to_numpy(), n_pos), np.repeat(design.family.to_numpy(),
                                                                                           n_non)]),
            setting=np.concatenate([np.repeat(design.setting.to_numpy(), n_pos),
                                    np.repeat(design.setting.to_numpy(), n_non)]),
            model=np.concatenate([np.repeat(design.model.to_numpy(), n_pos), np.repeat(design.model.to_numpy(),
                                                                                         n_non)]),
            seed=0, alignment=np.concatenate([np.ones(len(r_pos)), -np.ones(len(r_non))])))
        frame["eval_observed"] = np.where(fell, -1.0, 1.0)
        found += sign_prediction(frame, 1.0, resamples=resamples, seed=trial, auc=False).label.tolist()
    return {label: found.count(label) / len(found) for label in sorted(set(found))}


def describe_prediction(prediction: pd.DataFrame) -> str:
    """A sentence per family and setting: both conditionals, their difference and the AUC with intervals, the
    verdict and why."""
    if prediction.empty:
        return "No sign draw at this profile."
    lines = []
    for r in prediction.itertuples():
        auc = ("; " + auc_text(r.auc, r.auc_lo, r.auc_hi, "AUC of $\\mu_M^\\top g_K$ for a fall")
               if hasattr(r, "auc") else "")
        diff = (f"{100 * r.difference:+.1f} points [{100 * r.difference_lo:+.1f}, {100 * r.difference_hi:+.1f}]"
                if np.isfinite(r.difference) else "not measured")
        lines.append(
            f"- **{family_name(r.family)}, {SETTING_NAMES.get(r.setting, r.setting)}** ({r.models} models): P(fall on E | "
            f"$\\mu_M^\\top g_K > 0$) {percent_interval(r.p_pos, r.p_pos_lo, r.p_pos_hi)} of {r.n_pos}; P(fall | $\\le 0$) "
            f"{percent_interval(r.p_nonpos, r.p_nonpos_lo, r.p_nonpos_hi)} of {r.n_nonpos}; difference {diff}{auc}: "
            f"**{r.label}** ({r.reason}).")
    return "\n".join(lines)


def describe_prediction_calibration(design: pd.DataFrame, trials: int = 100) -> str:
    """A sentence: how often the prediction rule says "reproduced" at this design with an effect (98% of positive
    draws fall, 50% of the others) and without one (the sign tells nothing: 98% or 50% fall either way)."""
    if design.empty:
        return "No sign draw at this profile: the prediction rule's power is not simulated."
    cases = {"effect": (0.98, 0.5), "helps whatever": (0.98, 0.98), "nothing": (0.5, 0.5)}
    found = {name: simulate_prediction_verdict(design, *rates, trials=trials) for name, rates in cases.items()}
    return (f"**What the prediction rule can tell at this design** ({design.model.nunique()} models, "
            f"{trials} simulated tables, each (model, layer) cell with its own rates): with an effect (98% of the "
            f"positive draws fall, 50% of the others) it says *reproduced* in "
            f"{found['effect'].get('reproduced', 0):.0%} of the (family, setting) groups; when a step helps whatever "
            f"its alignment (98% both) in {found['helps whatever'].get('reproduced', 0):.0%} (*partly* in "
            f"{found['helps whatever'].get('partly', 0):.0%}); when the sign tells nothing (50% both) in "
            f"{found['nothing'].get('reproduced', 0):.0%}.")
