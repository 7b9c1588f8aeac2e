"""The certificates' rows (§2): whether B_exact covers the misalignment rate on fresh examples, whether it tracks
the rate across models, and whether the rate falls with the budget.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
# scipy.stats is imported by the functions that use it: importing it costs 1.3 s of CPU, paid at start-up by
# every process importing this module (a dry run, a torchrun rank, --print-config) that never uses it.

from dalign_core.geometry.misalignment import wilson_interval
from dalign_repro.claims.checks import (CAN_BARELY_FAIL, CHECKS, HALF_CERTIFICATE, budget_fail_chance,
                                       coverage_fail_chance)
from dalign_repro.claims.rows import (NOT_RUN, Row, STALE, read_current, is_stale, regimes_of, regime_part, FAMILIES,
                                     scope_of)
from dalign_repro.studies.growth.scoring import average_ranks

__all__ = ["TRACKING", "COVERAGE", "UNINFORMATIVE", "tracking_interval", "tracking_label", "certificate_rows"]


TRACKING = {"reproduced": 0.7, "partly": 0.3}
"""Rank correlation of B_exact with the empirical misalignment rate: tracks (≥ 0.7), partly (≥ 0.3)."""

COVERAGE = 0.8
"""A certificate covers the rate on fresh examples when p̂ ≤ B_exact in at least this share of informative cells."""
UNINFORMATIVE = 0.5
"""A certificate of 0.5 or more certifies nothing (a coin flip): such cells are counted apart, never as support."""


def _label(holds: int, total: int, reversed_: int = 0) -> str:
    """All of ``total`` hold: reproduced; some: partly; the opposite in all: contradicted; else inconclusive."""
    if total and holds == total:
        return "reproduced"
    return "partly" if holds else "contradicted" if total and reversed_ == total else "inconclusive"


class _BudgetRows:
    """One budget's (B_exact, p̂) rows grouped by model, with each value's position among the column's distinct values,
    so that a resample's ranks come from counts (:func:`average_ranks`) instead of a sort of its rows."""

    def __init__(self, values: np.ndarray, owners: np.ndarray, models: list[str]):
        self.values = values
        self.rows_of = {m: np.flatnonzero(owners == m) for m in models}
        self.exact = bool(np.isfinite(values).all())  # NaN has no rank here: such a budget takes scipy's way
        self.codes = [np.unique(column, return_inverse=True) for column in values.T] if self.exact else []

    def rank_correlation(self, picked: list[str]) -> float:
        """Spearman's ρ of the picked models' rows (a model picked twice counts twice), as
        ``scipy.stats.spearmanr(x, y).statistic`` computes it: Pearson's r of the average ranks; NaN where a column
        is constant or there are fewer than 3 rows."""
        from scipy import stats
        rows = np.concatenate([self.rows_of[m] for m in picked])
        x, y = self.values[rows, 0], self.values[rows, 1]
        if len(rows) <= 2 or not (np.ptp(x) > 0 and np.ptp(y) > 0):
            return math.nan
        if not self.exact:
            return float(np.corrcoef(stats.rankdata(x), stats.rankdata(y))[1, 0])
        ranks = [average_ranks(inverse[rows], len(distinct)) for distinct, inverse in self.codes]
        return float(np.corrcoef(*ranks)[1, 0])


def tracking_interval(budgets: list[pd.DataFrame], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
                      ) -> tuple[float, float, float, int]:
    """The tracking statistic and its interval: per budget the rank correlation of ``b_exact`` with ``p_misalign``
    across rows, the median over ``budgets``; its percentile interval resamples the models (``model, seed``: a
    model's rows at every layer and budget go together). Returns (median ρ, lo, hi, models); NaN without a budget."""
    if not budgets:
        return math.nan, math.nan, math.nan, 0
    key = lambda g: (g.model.astype(str) + "|" + g.seed.astype(str)).to_numpy()  # noqa: E731
    models = sorted(set().union(*(set(key(g)) for g in budgets)))
    parts = [_BudgetRows(g[["b_exact", "p_misalign"]].to_numpy(float), key(g), models) for g in budgets]

    def statistic(picked: list[str]) -> float:
        values = [part.rank_correlation(picked) for part in parts]
        return float(np.nanmedian(values)) if np.isfinite(values).any() else math.nan

    rho = statistic(models)
    rng = np.random.default_rng(seed)
    boot = np.array([statistic([models[i] for i in rng.integers(0, len(models), len(models))])
                     for _ in range(resamples)])
    boot = boot[np.isfinite(boot)]
    if not np.isfinite(rho) or not len(boot):
        return rho, math.nan, math.nan, len(models)
    tail = 100 * (1 - confidence) / 2
    return rho, float(np.percentile(boot, tail)), float(np.percentile(boot, 100 - tail)), len(models)


def tracking_label(lo: float, hi: float) -> str:
    """The tracking rule reads the interval's lower end: ``reproduced`` at ≥ 0.7, ``partly`` at ≥ 0.3;
    ``contradicted`` when the whole interval lies below 0.3; ``inconclusive`` when it holds 0.3."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "inconclusive"
    if lo >= TRACKING["reproduced"]:
        return "reproduced"
    if lo >= TRACKING["partly"]:
        return "partly"
    return "contradicted" if hi < TRACKING["partly"] else "inconclusive"


def certificate_rows(results: Path, only: tuple[str, ...] | None = None) -> list[Row]:
    """The certificates' rows of each family and regime (``only``: the families to judge, all where None)."""
    rows = []
    for family, column, chapter in FAMILIES:
        if only is not None and family not in only:
            continue
        table = read_current(results, f"{family}_misalignment")
        same = None if table is None else table[(table.setting == "heldout/heldout") & table.trained_ok.astype(bool)]
        fresh_all = None if table is None else table[(table.setting == "evaluation/evaluation")
                                                     & table.trained_ok.astype(bool)]
        for value in regimes_of(same, column) or [None]:
            scope = scope_of(family, column, value)
            part = regime_part(same, column, value) if same is not None else None
            fresh = regime_part(fresh_all, column, value) if fresh_all is not None else None
            if part is None or part.empty:
                for claim, paper in (("empirical ≤ B_exact ≤ B_align", "ordered (§2)"),
                                     ("certificates track the empirical rate", "track (§2)"),
                                     ("misalignment falls with M and K", "falls (§2)")):
                    ours = STALE if is_stale(results, f"{family}_misalignment") else "—"
                    rows.append(Row(claim, scope, paper, ours, NOT_RUN, chapter,
                                    section=CHECKS if claim == "misalignment falls with M and K" else "claims"))
                continue
            # Out of sample: the held-out pool's B_exact against p̂ resampled from disjoint evaluation examples.
            # (On the pool that gave B_exact, p̂ ≤ B_exact is Cantelli's inequality on that pool's own law.)
            if fresh is None or fresh.empty:
                rows.append(Row("empirical ≤ B_exact ≤ B_align", scope, "ordered (§2)",
                                "no p̂ on fresh examples in these results", NOT_RUN, chapter))
                fresh = part.iloc[0:0]
            else:
                informative = fresh[fresh.b_exact < UNINFORMATIVE]
                covered = int((informative.p_misalign <= informative.b_exact + 1e-12).sum())
                n = len(informative)
                lo, hi = wilson_interval(covered, n) if n else (math.nan, math.nan)
                label = ("inconclusive" if n == 0 else "reproduced" if lo >= COVERAGE else
                         "contradicted" if hi < COVERAGE else "inconclusive")
                ours = (f"p̂ on fresh examples ≤ B_exact in {covered} of {n} informative cells "
                        f"({covered / n:.0%}, Wilson [{lo:.0%}, {hi:.0%}])" if n else "no informative cell")
                ours += f"; {len(fresh) - n} cells with B_exact ≥ {UNINFORMATIVE} left out as uninformative"
                # Could it have failed? A certificate half as large still passing means p̂ lies far below the bound.
                fail = coverage_fail_chance(informative, COVERAGE) if {"model", "seed"} <= set(informative) else math.nan
                check = np.isfinite(fail) and fail < CAN_BARELY_FAIL
                if n:
                    ratio = float((informative.p_misalign / informative.b_exact).median())
                    ours += (f"; p̂ is a median {ratio:.1%} of B_exact, and {HALF_CERTIFICATE} the rule fails "
                             f"{fail:.0%} of the time" + (": it can barely fail here, a check of the computation, not "
                                                          "a reproduction" if check else ""))
                rows.append(Row("empirical ≤ B_exact ≤ B_align", scope, "ordered (§2)", ours, label, chapter,
                                section=CHECKS if check else "claims", fail_chance=fail,
                                alternative=HALF_CERTIFICATE if n else ""))
            # Within one budget, across models: does the certificate follow the differences between models? (Across
            # budgets both fall with M + K, which would make any certificate look as if it tracked.) p̂ comes from
            # fresh examples, so a shared estimation error cannot make the two agree.
            # Only budgets whose median certificate is informative: ranking certificates of 0.5 or more against p̂
            # would credit a bound that certifies nothing.
            budgets = [g for _, g in fresh.groupby(["M", "K"]) if len(g) > 2]
            informative = [g for g in budgets if g.b_exact.median() < UNINFORMATIVE]
            rho, rho_lo, rho_hi, models = tracking_interval(informative)
            tracks = tracking_label(rho_lo, rho_hi)
            if np.isfinite(rho):
                ours = (f"rank correlation {rho:.2f} [{rho_lo:.2f}, {rho_hi:.2f}] of B_exact with p̂ on fresh "
                        f"examples across {models} models (median over the {len(informative)} of {len(budgets)} "
                        f"budgets whose median B_exact is below {UNINFORMATIVE}; 95% bootstrap over models)")
            elif budgets and not informative:
                ours, tracks = (f"median B_exact ≥ {UNINFORMATIVE} at every budget: the certificates certify "
                                "nothing to track", "inconclusive")
            else:
                ours, tracks = "—", NOT_RUN
            rows.append(Row("certificates track the empirical rate", scope, "track (§2)", ours, tracks, chapter))
            holds = reversed_ = total = 0
            for _, model in part.groupby(["model", "seed"]):
                model = model.assign(size=model.M + model.K).sort_values("size")
                if len(model) < 2:
                    continue
                small, large = model.iloc[0], model.iloc[-1]
                total += 1
                holds += int(large.p_misalign_hi < small.p_misalign_lo)
                reversed_ += int(large.p_misalign_lo > small.p_misalign_hi)
            fail = budget_fail_chance(part)
            rows.append(Row("misalignment falls with M and K", scope, "falls (§2)",
                            (f"{holds} of {total} models; implied by the variance formula whenever μ̄ ≠ 0 "
                             f"(Var/‖μ̄‖⁴ = (1/M + 1/K)/d_∥ + 1/(MK·d_2))"
                             + (f": with p̂ drawn at the rate each model's own moments give, the rule fails "
                                f"{fail:.0%} of the time" if np.isfinite(fail) else "")
                             + ", so this checks the resampler against the formula, not the paper" if total else "—"),
                            _label(holds, total, reversed_) if total else NOT_RUN, chapter, section=CHECKS,
                            fail_chance=fail, alternative="p̂ at each budget drawn at the rate the model's exact "
                                                          "moments give (Gaussian tail)"))
    return rows
