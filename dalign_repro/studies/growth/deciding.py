"""The growth claim's decision: does choosing the top point by d_align lose less than the baselines?

**Decision** (:func:`decision`), the claim the claims table judges (:data:`CLAIM`): among
models with at least :data:`MIN_POINTS` points whose gains stand above their noise
(:func:`noise`: spread across points ≥ :data:`NOISE_RATIO` standard errors of one point's
gain), the regret of d_align's choice against a random choice (its expectation), the
gradient norm's and fixed rules' (:func:`regrets`), with t intervals over models; both
advantages above 0 ``reproduced``, either below ``contradicted``, else ``inconclusive``,
also when one model left out changes the label. :func:`simulate_decision` runs it on
simulated gains at a given design.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from dalign_core.growth.predicting import SIGN
from dalign_repro.studies.growth.scoring import CLAIM, first_choice, model_keys, t_interval, t_quantile

__all__ = ["DECISION_CLAIM", "MIN_POINTS", "NOISE_RATIO", "FIXED_RULES", "noise", "regrets", "Decision", "decision",
           "simulate_decision"]


DECISION_CLAIM = CLAIM
MIN_POINTS = 4
"""Insertion points a model needs for its choice to be a ranking (with 2, any order is a coin flip)."""
NOISE_RATIO = 2.0
"""A model's points are told apart when the spread of their gains is at least this many standard errors of one
point's gain (SE ≤ half the spread)."""
FIXED_RULES = ("first", "middle", "last")
"""Choices that read no statistic: always the first, the middle or the last insertion point of the model."""


@dataclass(frozen=True)
class _Model:
    """One grown model at one budget, as the decision reads it: its points' gains in the table's order and, for the
    regrets, the gains and predictors in ``layer_index`` order."""

    key: dict
    """Model keys and ``budget_steps`` → value."""
    points: int
    """Distinct insertion points (layers)."""
    repeats: int
    gain: np.ndarray
    span: np.ndarray
    """gain_hi − gain_lo per point (its interval's width), nats."""
    ordered_gain: np.ndarray
    predictors: dict
    """name → values in ``layer_index`` order."""

    def noise(self, confidence: float) -> dict:
        """:func:`noise`'s row of this model."""
        quantile = t_quantile(confidence, self.repeats - 1) if self.repeats > 1 else math.nan
        se_points = self.span / (2 * quantile)
        se = float(np.sqrt(np.nanmean(se_points ** 2))) if self.repeats > 1 else math.nan
        spread = float(self.gain.std(ddof=1)) if len(self.gain) > 1 else math.nan
        ratio = spread / se if se and math.isfinite(se) else math.nan
        return {**self.key, "points": self.points, "repeats": self.repeats, "spread": spread, "se": se,
                "ratio": ratio, "told_apart": bool(ratio >= NOISE_RATIO and self.points >= MIN_POINTS)}

    def regrets(self, names: Sequence[str]) -> dict | None:
        """:func:`regrets`'s row of this model (None when no gain is finite)."""
        gain = self.ordered_gain
        if not np.isfinite(gain).any():
            return None
        best = float(np.nanmax(gain))
        row = {**self.key, "points": len(gain), "random": best - float(np.nanmean(gain))}
        for name in names:
            row[name] = best - float(gain[first_choice(SIGN(name) * self.predictors[name])])
        for rule, index in zip(FIXED_RULES, (0, len(gain) // 2, len(gain) - 1)):
            row[rule] = best - float(gain[index])
        return row


def _models(table: pd.DataFrame, names: Sequence[str] = ()) -> list[_Model]:
    """Each model and budget of a growth table (rows per model, point and budget), in order of first appearance."""
    keys = model_keys(table) + ["budget_steps"]
    models = []
    for key, part in table.groupby(keys, sort=False, dropna=False):
        ordered = part.sort_values("layer_index") if "layer_index" in part else part
        has_bounds = "gain_hi" in part and "gain_lo" in part
        models.append(_Model(
            key=dict(zip(keys, key)), points=int(part.layer.nunique()),
            repeats=int(part.repeats.iloc[0]) if "repeats" in part else 0,
            gain=part.gain.to_numpy(float),
            span=(part.gain_hi - part.gain_lo).to_numpy(float) if has_bounds else np.full(len(part), math.nan),
            ordered_gain=ordered.gain.to_numpy(float),
            predictors={name: ordered[name].to_numpy(float) for name in names if name in ordered}))
    return models


def noise(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Per model and budget: ``points``, ``spread`` (SD of the gain across points, nats), ``se`` (root mean square
    over points of one point's standard error, from its t interval over ``repeats``) and ``ratio`` = spread / se;
    ``told_apart`` when the ratio reaches :data:`NOISE_RATIO` and there are :data:`MIN_POINTS` points."""
    return pd.DataFrame([model.noise(confidence) for model in _models(table)])


def regrets(table: pd.DataFrame, names: Sequence[str] = ("d_align", "grad_norm")) -> pd.DataFrame:
    """Per model and budget, the regret (nats: the best point's gain minus the chosen one's) of choosing by each
    predictor of ``names``, of a random choice (its expectation: best minus the mean gain over points) and of each
    fixed rule of :data:`FIXED_RULES` (by ``layer_index``, else the table's order). One column per choice."""
    rows = [model.regrets(names) for model in _models(table, names)]
    return pd.DataFrame([row for row in rows if row is not None])


@dataclass(frozen=True)
class Decision:
    """The growth decision judged for one family (or all) at one budget."""

    label: str
    reason: str
    models: int
    """Models judged (at least :data:`MIN_POINTS` points and their gains told apart)."""
    of: int
    """Models grown."""
    regret: dict
    """choice → (mean regret over the judged models, lo, hi), nats."""
    advantage: dict
    """baseline → (mean of baseline's regret − d_align's, lo, hi): positive = d_align loses less."""
    best_fixed: str = ""
    leave_one_out: tuple = (math.nan, math.nan)
    """Range of the smaller advantage's lower end with each judged model left out."""
    ratios: tuple = ()
    """(model name, spread/SE) of every grown model."""

    def sentence(self, where: str = "") -> str:
        """The verdict in one generated sentence (numbers in nats)."""
        if not self.regret:
            return f"{DECISION_CLAIM}{where}: **{self.label}** ({self.reason})."
        parts = ", ".join(f"{name.replace('_', ' ')} {m:.2g} [{lo:.2g}, {hi:.2g}]" for name, (m, lo, hi) in
                          self.regret.items())
        return (f"{DECISION_CLAIM}{where}: **{self.label}** ({self.reason}). Mean regret over {self.models} of "
                f"{self.of} models (nats, 95% t interval): {parts}; best fixed rule: {self.best_fixed}; "
                f"leave-one-out range of the smaller advantage's lower end [{self.leave_one_out[0]:.2g}, "
                f"{self.leave_one_out[1]:.2g}].")


def _decide(wide: dict[str, np.ndarray], confidence: float) -> tuple[str, str, dict]:
    """The label from the regrets of the judged models (choice → one value per model)."""
    advantage = {base: t_interval(wide[base] - wide["d_align"], confidence) for base in ("random", "grad_norm")}
    lows = [advantage[b][1] for b in advantage]
    highs = [advantage[b][2] for b in advantage]
    if not all(math.isfinite(v) for v in lows + highs):
        return "not estimable", "fewer than 2 models judged", advantage
    if min(lows) > 0:
        return "reproduced", "d_align's regret lies below both random's and the gradient norm's", advantage
    if min(highs) < 0:
        worse = [b.replace("_", " ") for b in advantage if advantage[b][2] < 0]
        return "contradicted", f"d_align's regret lies above {' and '.join(worse)}'s", advantage
    return "inconclusive", "an interval of d_align's advantage holds 0", advantage


PREDICTORS = ("d_align", "grad_norm")
"""The predictors whose choices the decision compares."""


def decision(table: pd.DataFrame, budget: int | None = None, family: str | None = None,
             confidence: float = 0.95) -> Decision:
    """Judge :data:`DECISION_CLAIM` from a growth table (rows per model, point and budget).

    Models with fewer than :data:`MIN_POINTS` points, or whose gains are not told apart (:func:`noise`), are left
    out; with fewer than 2 left the label is ``not estimable`` (too few points) or ``inconclusive`` (the gains are
    below their noise), with the reason. Otherwise, per model, the regrets of :func:`regrets`; the advantage over a
    baseline is its regret minus d_align's, with a t interval over models. ``reproduced`` when both advantages (over
    random and over the gradient norm) lie above 0, ``contradicted`` when either lies below 0, else
    ``inconclusive``; and ``inconclusive`` when leaving out any one model changes the label (fragile)."""
    rows = table if family is None else table[table.family == family]
    if rows.empty:
        return Decision("not run", "no grown model", 0, 0, {}, {})
    budget = int(rows.budget_steps.max()) if budget is None else budget
    return _judge(_models(rows[rows.budget_steps == budget], PREDICTORS), confidence)


def _judge(models: list[_Model], confidence: float) -> Decision:
    """:func:`decision` on the models of one family (or all) at one budget."""
    told = [model.noise(confidence) for model in models]
    ratios = tuple((f"{row['model']} s{row['seed']}", float(row["ratio"])) for row in told)
    of = len(told)
    enough = [(model, row) for model, row in zip(models, told) if row["points"] >= MIN_POINTS]
    judged = [model for model, row in enough if row["told_apart"]]
    if len(enough) < 2:
        return Decision("not estimable", f"{max(row['points'] for row in told) if of else 0} insertion points per "
                        f"model: at least {MIN_POINTS} are needed for a choice to be a ranking", 0, of, {}, {},
                        ratios=ratios)
    if len(judged) < max(2, math.ceil(len(enough) / 2)):  # a design whose points most models cannot tell apart
        median = float(pd.Series([row["ratio"] for _, row in enough], dtype=float).median())
        return Decision("inconclusive", f"the gains are below their noise: spread/SE across points has median "
                        f"{median:.2f} (at least {NOISE_RATIO:g} needed; {len(judged)} of "
                        f"{len(enough)} models reach it), so the experiment cannot tell the points apart",
                        0, of, {}, {}, ratios=ratios)
    found = [row for row in (model.regrets(PREDICTORS) for model in judged) if row is not None]
    choices = (*PREDICTORS, "random", *FIXED_RULES)
    wide = {name: np.array([row[name] for row in found], dtype=float) for name in choices}
    regret = {name: t_interval(wide[name], confidence) for name in choices}
    best_fixed = min(FIXED_RULES, key=lambda rule: regret[rule][0])
    label, reason, advantage = _decide(wide, confidence)
    shown = {name: regret[name] for name in ("d_align", "grad_norm", "random")}
    shown[f"always {best_fixed}"] = regret[best_fixed]
    left = []  # leave one model out (with at least two models left to judge)
    for i in range(len(found) if len(found) > 2 else 0):
        l_label, _, l_adv = _decide({name: np.delete(values, i) for name, values in wide.items()}, confidence)
        left.append((l_label, min(l_adv[b][1] for b in l_adv)))
    span = (min(v for _, v in left), max(v for _, v in left)) if left else (math.nan, math.nan)
    if any(l_label != label for l_label, _ in left):
        changed = sorted({l_label for l_label, _ in left if l_label != label})
        reason = f"{reason}, but leaving out one model turns it {' or '.join(changed)}"
        label = "inconclusive"
    return Decision(label, reason, len(found), of, shown, advantage, best_fixed, span, ratios)


def simulate_decision(points: Sequence[int], effect: float, ratio: float = 3.0, repeats: int = 2, trials: int = 200,
                      seed: int = 0, confidence: float = 0.95, backwards: float = 0.0) -> dict[str, float]:
    """How often :func:`decision` gives each label for models with ``points`` insertion points each, when the true
    gains follow d_align with weight ``effect`` (0: unrelated to d_align) and run against the gradient norm with
    weight ``backwards`` (a baseline worse than random), and each point's gain is measured over ``repeats`` growths
    with a standard error of the spread across points / ``ratio``."""
    rng = np.random.default_rng(seed)
    found = []
    quantile = t_quantile(confidence, repeats - 1)
    for _ in range(trials):
        models = []
        for m, n in enumerate(points):
            d, g = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
            true = (effect * (d - d.mean()) / d.std() - backwards * (g - g.mean()) / g.std()
                    + (1 - effect - backwards) * rng.normal(size=n))
            true = true / true.std()
            draws = true[:, None] + rng.normal(scale=math.sqrt(repeats) / ratio, size=(n, repeats))
            mean = draws.mean(axis=1)
            half = quantile * draws.std(ddof=1, axis=1) / math.sqrt(repeats)
            models.append(_Model(key=dict(family="toy", model=f"m{m}", seed=0, budget_steps=1), points=n,
                                 repeats=repeats, gain=mean, span=(mean + half) - (mean - half), ordered_gain=mean,
                                 predictors=dict(d_align=d, grad_norm=g)))
        found.append(_judge(models, confidence).label)
    return {label: found.count(label) / trials for label in sorted(set(found))}


def rank_evidence() -> str | None:
    """What this project's growth results (the largest profile present) say of d_align as a guide to where to grow,
    in one sentence, or None outside a checkout with results. Registered for ``dalign rank`` under the entry-point
    group ``dalign.rank_evidence`` (:data:`dalign_core.cli.rank.EVIDENCE_GROUP`)."""
    from dalign_repro.config import REPO_ROOT
    from dalign_repro.report.results import read_table

    for profile in ("paper", "gpu", "cpu"):
        try:
            table, _ = read_table(REPO_ROOT / "results" / profile, "growth")
        except (FileNotFoundError, ValueError, KeyError):
            continue
        if table.empty:
            continue
        judged = decision(table)
        return (f"the project's growth results ({profile} profile, {judged.of} grown models) say of d_align as a guide "
                f"to where to grow: {judged.label} ({judged.reason}).")
    return None
