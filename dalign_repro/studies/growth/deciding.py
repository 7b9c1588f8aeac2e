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
from scipy import stats

from dalign_core.growth.predicting import SIGN
from dalign_repro.studies.growth.scoring import CLAIM, first_choice, model_keys, t_interval

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


def noise(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Per model and budget: ``points``, ``spread`` (SD of the gain across points, nats), ``se`` (root mean square
    over points of one point's standard error, from its t interval over ``repeats``) and ``ratio`` = spread / se;
    ``told_apart`` when the ratio reaches :data:`NOISE_RATIO` and there are :data:`MIN_POINTS` points."""
    keys = model_keys(table) + ["budget_steps"]
    rows = []
    for key, part in table.groupby(keys, sort=False, dropna=False):
        repeats = int(part.repeats.iloc[0]) if "repeats" in part else 0
        quantile = float(stats.t.ppf(1 - (1 - confidence) / 2, repeats - 1)) if repeats > 1 else math.nan
        se_points = (part.gain_hi - part.gain_lo) / (2 * quantile)
        se = float(np.sqrt(np.nanmean(se_points.to_numpy(float) ** 2))) if repeats > 1 else math.nan
        spread = float(part.gain.std(ddof=1)) if len(part) > 1 else math.nan
        ratio = spread / se if se and math.isfinite(se) else math.nan
        rows.append({**dict(zip(keys, key)), "points": int(part.layer.nunique()), "repeats": repeats,
                     "spread": spread, "se": se, "ratio": ratio,
                     "told_apart": bool(ratio >= NOISE_RATIO and part.layer.nunique() >= MIN_POINTS)})
    return pd.DataFrame(rows)


def regrets(table: pd.DataFrame, names: Sequence[str] = ("d_align", "grad_norm")) -> pd.DataFrame:
    """Per model and budget, the regret (nats: the best point's gain minus the chosen one's) of choosing by each
    predictor of ``names``, of a random choice (its expectation: best minus the mean gain over points) and of each
    fixed rule of :data:`FIXED_RULES` (by ``layer_index``, else the table's order). One column per choice."""
    keys = model_keys(table) + ["budget_steps"]
    rows = []
    for key, part in table.groupby(keys, sort=False, dropna=False):
        part = part.sort_values("layer_index") if "layer_index" in part else part
        gain = part.gain.to_numpy(float)
        if not np.isfinite(gain).any():
            continue
        best = float(np.nanmax(gain))
        row = {**dict(zip(keys, key)), "points": len(part), "random": best - float(np.nanmean(gain))}
        for name in names:
            row[name] = best - float(gain[first_choice(SIGN(name) * part[name].to_numpy(float))])
        for rule, index in zip(FIXED_RULES, (0, len(part) // 2, len(part) - 1)):
            row[rule] = best - float(gain[index])
        rows.append(row)
    return pd.DataFrame(rows)


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


def _decide(wide: pd.DataFrame, confidence: float) -> tuple[str, str, dict]:
    advantage = {base: t_interval((wide[base] - wide["d_align"]).to_numpy(float), confidence)
                 for base in ("random", "grad_norm")}
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
    rows = rows[rows.budget_steps == budget]
    told = noise(rows, confidence)
    ratios = tuple((f"{r.model} s{r.seed}", float(r.ratio)) for r in told.itertuples())
    of = len(told)
    enough = told[told.points >= MIN_POINTS]
    judged = enough[enough.told_apart]
    if len(enough) < 2:
        return Decision("not estimable", f"{int(told.points.max()) if of else 0} insertion points per model: at least "
                        f"{MIN_POINTS} are needed for a choice to be a ranking", 0, of, {}, {}, ratios=ratios)
    if len(judged) < max(2, math.ceil(len(enough) / 2)):  # a design whose points most models cannot tell apart
        return Decision("inconclusive", f"the gains are below their noise: spread/SE across points has median "
                        f"{float(enough.ratio.median()):.2f} (at least {NOISE_RATIO:g} needed; {len(judged)} of "
                        f"{len(enough)} models reach it), so the experiment cannot tell the points apart",
                        0, of, {}, {}, ratios=ratios)
    label_of = lambda frame: ["|".join(map(str, v)) for v in zip(*(frame[k] for k in model_keys(rows)))]  # noqa: E731
    chosen = rows[np.isin(label_of(rows), label_of(judged))]
    wide = regrets(chosen)
    regret = {name: t_interval(wide[name].to_numpy(float), confidence)
              for name in ("d_align", "grad_norm", "random", *FIXED_RULES)}
    best_fixed = min(FIXED_RULES, key=lambda rule: regret[rule][0])
    label, reason, advantage = _decide(wide, confidence)
    shown = {name: regret[name] for name in ("d_align", "grad_norm", "random")}
    shown[f"always {best_fixed}"] = regret[best_fixed]
    left = []
    for i in range(len(wide)):
        others = wide.drop(index=wide.index[i])
        if len(others) < 2:
            continue
        l_label, _, l_adv = _decide(others, confidence)
        left.append((l_label, min(l_adv[b][1] for b in l_adv)))
    span = (min(v for _, v in left), max(v for _, v in left)) if left else (math.nan, math.nan)
    if any(l_label != label for l_label, _ in left):
        changed = sorted({l_label for l_label, _ in left if l_label != label})
        reason = f"{reason}, but leaving out one model turns it {' or '.join(changed)}"
        label = "inconclusive"
    return Decision(label, reason, len(wide), of, shown, advantage, best_fixed, span, ratios)


def simulate_decision(points: Sequence[int], effect: float, ratio: float = 3.0, repeats: int = 2, trials: int = 200,
                      seed: int = 0, confidence: float = 0.95, backwards: float = 0.0) -> dict[str, float]:
    """How often :func:`decision` gives each label for models with ``points`` insertion points each, when the true
    gains follow d_align with weight ``effect`` (0: unrelated to d_align) and run against the gradient norm with
    weight ``backwards`` (a baseline worse than random), and each point's gain is measured over ``repeats`` growths
    with a standard error of the spread across points / ``ratio``."""
    rng = np.random.default_rng(seed)
    found = []
    quantile = float(stats.t.ppf(1 - (1 - confidence) / 2, repeats - 1))
    for _ in range(trials):
        rows = []
        for m, n in enumerate(points):
            d, g = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
            true = (effect * (d - d.mean()) / d.std() - backwards * (g - g.mean()) / g.std()
                    + (1 - effect - backwards) * rng.normal(size=n))
            true = true / true.std()
            for i in range(n):
                draws = true[i] + rng.normal(scale=math.sqrt(repeats) / ratio, size=repeats)
                mean, sd = draws.mean(), draws.std(ddof=1)
                half = quantile * sd / math.sqrt(repeats)
                rows.append(dict(family="toy", model=f"m{m}", seed=0, layer=f"l{i}", layer_index=i, d_align=d[i],
                                 grad_norm=g[i], budget_steps=1, gain=mean, gain_lo=mean - half,
                                 gain_hi=mean + half, repeats=repeats))
        found.append(decision(pd.DataFrame(rows), confidence=confidence).label)
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
