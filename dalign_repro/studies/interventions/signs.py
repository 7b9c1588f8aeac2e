"""The sign as the paper reads it: does a step along μ_M with μ_Mᵀg_K > 0 lower the loss on E?

**Sign** (paper: positive alignment consistently predicted a decrease). At the judged step
δ = ``sign_step`` (a single step), among the draws with ``μ_Mᵀg_K > 0``, the share whose
step lowered the loss on E, ``P(ΔL_E < 0 | μ_Mᵀg_K > 0)``: *reproduced* when at least
95 %, *partly* at least 80 %, *not reproduced* below, *inconclusive* when the Wilson
interval holds both 80 % and 95 %. Beside it: ``P(ΔL_E < 0 | μ_Mᵀg_K ≤ 0)`` (how much the
sign tells at all) and the share of draws with positive alignment, the informative number,
set beside ``1 − B_align`` of the same (M, K). Draws whose change on E is within roundoff
even in float64 (``eval_tie``) are left out and counted.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dalign_repro.report.describe.text import number
from dalign_repro.studies.interventions.draws import (SIGN_BANDS, Z_BINS, DRAW_COLUMNS, wilson_rate,
                                                     share_with_interval, single_steps, measured_changes,
                                                     judged_steps, percent, percent_interval, family_name)

__all__ = ["conditional_decrease", "agreement", "sign_agreement", "sign_verdict", "sign_design",
           "simulate_sign_verdict", "describe_sign_calibration", "block_explained", "describe_sign", "describe_steps",
           "describe_lowest_bin"]


def conditional_decrease(table: pd.DataFrame, by: tuple[str, ...] = ("family", "kind", "train_decrease",
                                                                     "optimizer_steps"),
                         on: str = "eval", confidence: float = 0.95) -> pd.DataFrame:
    """Per group of sign-study rows: ``P(ΔL < 0 | μ_Mᵀg_K > 0)`` and ``P(ΔL < 0 | μ_Mᵀg_K ≤ 0)`` with Wilson
    intervals (``on="eval"``: ΔL_E, the loss on E; ``"heldout"``: ΔL_K, the same-sample check), the share of draws
    with positive alignment (ties included: the alignment is measured whatever the change), and the ties left out.

    Columns ``p_pos, p_pos_lo, p_pos_hi, n_pos`` (decrease given positive alignment), ``p_nonpos, ...,
    n_nonpos``, ``share_positive, share_positive_lo, share_positive_hi, draws``, ``ties``."""
    sign = table[table.study == "sign"] if len(table) else table
    rows = []
    if sign.empty:
        return pd.DataFrame(rows)
    for keys, group in sign.groupby(list(by)):
        keys = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)))
        kept, change, ties = measured_changes(group, on)
        positive = kept.alignment > 0
        row = {**keys}
        for name, mask in (("pos", positive), ("nonpos", ~positive)):
            n, k = int(mask.sum()), int((change[mask] < 0).sum())
            row[f"p_{name}"], row[f"p_{name}_lo"], row[f"p_{name}_hi"] = wilson_rate(k, n, confidence)
            row[f"n_{name}"] = n
        share = wilson_rate(int((group.alignment > 0).sum()), len(group), confidence)
        row.update(share_positive=share[0], share_positive_lo=share[1], share_positive_hi=share[2],
                   draws=len(group), ties=ties)
        rows.append(row)
    return pd.DataFrame(rows)


def agreement(frame: pd.DataFrame, on: str = "eval") -> pd.Series:
    """Whether each step moved the loss (on E, or on K) the way first order from μ_Mᵀg_K said (strict signs)."""
    change = frame.eval_observed if on == "eval" else frame.observed
    return (np.sign(change) == np.sign(frame.predicted)) & (frame.predicted != 0)


def sign_agreement(table: pd.DataFrame, step: float, by: tuple[str, ...] = ("family", "kind"),
                   on: str = "eval") -> pd.DataFrame:
    """Sign agreement at the single step ``step``, per group and per bin of ``z = |alignment| / sd`` (sd over the
    draws of one model, layer, setting and budget), with Wilson intervals; ties left out. ``z_bin`` "all" pools."""
    sign, _, _ = measured_changes(single_steps(table, step), on)
    sign = sign.copy()
    if sign.empty:
        return pd.DataFrame()
    spread = sign.groupby(DRAW_COLUMNS).alignment.transform("std")
    sign["z"] = sign.alignment.abs() / spread
    sign["z_bin"] = pd.cut(sign.z, Z_BINS, right=False).astype(str)
    sign["agrees"] = agreement(sign, on)
    rows = []
    for keys, group in sign.groupby(list(by)):
        keys = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)))
        rows.append({**keys, "z_bin": "all", **share_with_interval(int(group.agrees.sum()), len(group))})
        for z_bin, part in group.groupby("z_bin", sort=False):
            rows.append({**keys, "z_bin": z_bin, **share_with_interval(int(part.agrees.sum()), len(part))})
    return pd.DataFrame(rows)


def _sign_label(share: float, lo: float, hi: float) -> str:
    if not np.isfinite(share):
        return "inconclusive"
    if lo < SIGN_BANDS["partly"] <= SIGN_BANDS["reproduced"] <= hi:
        return "inconclusive"
    return ("reproduced" if share >= SIGN_BANDS["reproduced"] else
            "partly" if share >= SIGN_BANDS["partly"] else "not reproduced")


def sign_verdict(table: pd.DataFrame, step: float, kind: str = "bias", on: str = "eval") -> dict[str, tuple[str, dict]]:
    """Family → (verdict, facts) at the single step ``step``, judged on E (``on="eval"``) by default: the facts are
    a :func:`conditional_decrease` row (``p_pos`` is P(ΔL < 0 | μ_Mᵀg_K > 0)); see the module docstring."""
    cond = conditional_decrease(judged_steps(table, step, kind), by=("family",), on=on)
    return {r["family"]: (_sign_label(r["p_pos"], r["p_pos_lo"], r["p_pos_hi"]), r)
            for r in cond.to_dict("records")}


def sign_design(table: pd.DataFrame, step: float, kind: str = "bias") -> pd.DataFrame:
    """The sign verdict's design: per family and (model, layer, setting, M, K) cell, ``n`` the draws at the single
    step ``step`` with positive alignment whose change on E is measured (the draws the verdict counts)."""
    kept, _, _ = measured_changes(judged_steps(table, step, kind), "eval")
    positive = kept[kept.alignment > 0] if len(kept) else kept
    cells = [c for c in DRAW_COLUMNS if c != "kind"]
    return positive.groupby(cells).size().rename("n").reset_index() if len(positive) else pd.DataFrame(
        columns=[*cells, "n"])


def simulate_sign_verdict(design: pd.DataFrame, rate: float, spread: float = 10.0, trials: int = 100,
                          seed: int = 0) -> dict[str, float]:
    """How often :func:`sign_verdict` gives each label at ``design`` (a :func:`sign_design` table) when a share
    ``rate`` of the positive draws lower the loss on E. A family's draws share models, layers and E, so they are
    not independent: each cell draws its own rate from Beta(``rate·spread``, ``(1 − rate)·spread``) (``spread``
    10: cells differ by about ±0.05 at a rate of 0.98 and ±0.15 at 0.5), then its draws.

    Returns label → share over ``trials`` simulated tables and the families of each."""
    rng = np.random.default_rng(seed)
    n = design.n.to_numpy()
    family = np.repeat(design.family.to_numpy(), n)
    found: list[str] = []
    for _ in range(trials):
        rates = np.repeat(rng.beta(rate * spread, (1 - rate) * spread, size=len(design)), n)
        lowered = rng.random(len(rates)) < rates
        rows = pd.DataFrame(dict(study="sign", family=family, kind="bias", train_decrease=1.0, optimizer_steps=0,
                                 alignment=1.0, eval_observed=np.where(lowered, -1.0, 1.0), eval_tie=False))
        found += [label for label, _ in sign_verdict(rows, 1.0).values()]
    return {label: found.count(label) / len(found) for label in sorted(set(found))}


def describe_sign_calibration(design: pd.DataFrame, effect: float = 0.98, short: float = 0.85,
                              none: float = 0.5, trials: int = 100) -> str:
    """A sentence: how often the sign rule says "reproduced" at this design when the claim holds (``effect`` of the
    positive draws lower the loss on E), when it falls short (``short``) and when the sign tells nothing (``none``)."""
    if design.empty:
        return "No sign draw at this profile: the rule's power is not simulated."
    found = {rate: simulate_sign_verdict(design, rate, trials=trials).get("reproduced", 0.0)
             for rate in (effect, short, none)}
    sizes = design.groupby("family").n.agg(["sum", "size"])
    families = ", ".join(f"{family_name(f)}: {r['sum']} positive draws in {r['size']} cells" for f, r in sizes.iterrows())
    return (f"**What the sign rule can detect at this design** ({families}), simulated with each cell's "
            f"rate spread about the family's ({trials} tables): it says *reproduced* for {found[effect]:.0%} of the "
            f"simulated families when {effect:.0%} of positive draws lower the loss on E, in {found[short]:.0%} when "
            f"{short:.0%} do (short of \"consistently\"), and in {found[none]:.0%} when the sign tells nothing "
            f"({none:.0%}).")


def block_explained(table: pd.DataFrame, step: float, on: str = "eval") -> pd.DataFrame:
    """How far the shared-bias statistic explains the block: per family, the share of block steps (single, at
    ``step``) whose change on E has the sign ``−sign(μ_Mᵀg_K)`` of the same draw, and the rank correlation of the
    two alignments."""
    block = single_steps(table, step)
    block, change, _ = measured_changes(block[block.kind == "block"] if len(block) else block, on)
    rows = []
    for family, group in (block.groupby("family") if len(block) else ()):
        agrees = np.sign(change[group.index]) == -np.sign(group.bias_alignment)
        rows.append({"family": family, **share_with_interval(int(agrees.sum()), len(group)),
                     "rank_correlation": group.alignment.rank().corr(group.bias_alignment.rank())})
    return pd.DataFrame(rows)


def describe_sign(table: pd.DataFrame, step: float, kind: str = "bias") -> str:
    """A sentence per family at the judged step: P(ΔL_E < 0 | μ_Mᵀg_K > 0) and P(ΔL_E < 0 | μ_Mᵀg_K ≤ 0) on the
    evaluation set beside the same-sample share on K, the share of positive alignment, ties, and the verdict."""
    same = sign_verdict(table, step, kind, on="heldout")
    lines = []
    for family, (label, r) in sign_verdict(table, step, kind).items():
        k = same.get(family, (None, {}))[1]
        ties = f"; {r['ties']} ties on E (within roundoff in float64) left out" if r["ties"] else "; no ties on E"
        lines.append(
            f"- **{family_name(family)}** (δ = {number(step)}): positive alignment in {percent_interval(r['share_positive'], r['share_positive_lo'], r['share_positive_hi'])} "
            f"of {r['draws']} draws. Of the {r['n_pos']} with $\\mu_M^\\top g_K > 0$, "
            f"{percent_interval(r['p_pos'], r['p_pos_lo'], r['p_pos_hi'])} lowered the loss on the evaluation examples "
            f"(on the K examples themselves: {percent(k.get('p_pos', math.nan))}, the same-sample check); of the "
            f"{r['n_nonpos']} with $\\mu_M^\\top g_K \\le 0$, {percent_interval(r['p_nonpos'], r['p_nonpos_lo'], r['p_nonpos_hi'])} "
            f"did{ties}: **{label}**.")
    return "\n".join(lines) if lines else "No draw at this profile."


def describe_steps(cond: pd.DataFrame, kind: str = "bias") -> str:
    """One sentence per family: P(ΔL_E < 0 | μ_Mᵀg_K > 0) along the single steps δ and the optimizer steps."""
    if cond.empty:
        return ""
    lines = []
    for family, part in cond[cond.kind == kind].groupby("family"):
        single = part[part.optimizer_steps == 0].sort_values("train_decrease")
        trained = part[part.optimizer_steps > 0].sort_values("optimizer_steps")
        parts = [f"{percent(r.p_pos)} at δ = {number(r.train_decrease)} ({r.n_pos} draws)" for r in single.itertuples()]
        parts += [f"{percent(r.p_pos)} after {r.optimizer_steps} optimizer steps ({r.n_pos} draws)"
                  for r in trained.itertuples()]
        lines.append(f"- **{family_name(family)}**: P(ΔL_E < 0 | $\\mu_M^\\top g_K > 0$) is " + "; ".join(parts) + ".")
    return "\n".join(lines)


def describe_lowest_bin(agreement: pd.DataFrame) -> str:
    """Sign agreement where the statistic is smallest against its spread, beside the agreement over all draws."""
    if agreement.empty:
        return ""
    first = str(pd.Interval(Z_BINS[0], Z_BINS[1], closed="left"))
    parts = []
    for family, group in agreement.groupby("family"):
        low, overall = group[group.z_bin == first], group[group.z_bin == "all"]
        if len(low) and len(overall):
            low, overall = low.iloc[0], overall.iloc[0]
            parts.append(f"{family_name(family)} {percent(low.agree)} [{percent(low.agree_lo)}, "
                         f"{percent(low.agree_hi)}] of {low.draws} draws (all draws: {percent(overall.agree)})")
    if not parts:
        return ""
    return (f"Where $|\\mu_M^\\top g_K|$ is below {Z_BINS[1]:g} of its standard deviation, the signs agree in "
            + "; ".join(parts) + ".")
