"""What the intervention table says, and how it compares with the paper: every number and verdict computed.

The input is ``interventions.csv`` (:mod:`dalign_core.experiments.interventions`) and,
for the certificates, each family's ``<family>_geometry.csv``. Rates carry Wilson
intervals (:func:`dalign_core.misalignment.wilson_interval`), so a rate of 0 or 1 still
has an honest width.

**Two checks of one sign.** Each step is measured twice: on the K examples whose mean
gradient g_K gave the alignment ``μ_Mᵀg_K`` (``observed``), and on the evaluation set E,
examples the step never saw (``eval_observed``). On K, at a small step,
``ΔL_K = −η μ_Mᵀg_K + O(η²)``: the sign agrees with the alignment by Taylor's theorem
(the *same-sample check*, algebra; a disagreement there is roundoff or curvature). On E
the sign agrees only if what M and K share is also what fresh examples share (the
*out-of-sample check*, evidence). The sign claim is judged on E.

**Sign** (paper: positive alignment consistently predicted a decrease). At the judged step
δ = ``sign_step`` (a single step), among the draws with ``μ_Mᵀg_K > 0``, the share whose
step lowered the loss on E, ``P(ΔL_E < 0 | μ_Mᵀg_K > 0)``: *reproduced* when at least
95 %, *partly* at least 80 %, *not reproduced* below, *inconclusive* when the Wilson
interval holds both 80 % and 95 %. Beside it: ``P(ΔL_E < 0 | μ_Mᵀg_K ≤ 0)`` (how much the
sign tells at all) and the share of draws with positive alignment, the informative number,
set beside ``1 − B_align`` of the same (M, K). Draws whose change on E is within roundoff
even in float64 (``eval_tie``) are left out and counted.

**Retention** (paper: at small steps the observed change kept 96-99 % of the predicted
one). Retention ``ΔL_K / (−η μ_Mᵀg_K)`` is read, as the paper reads it, on draws that
predict a decrease (``μ_Mᵀg_K > 0``) only, as a curve over δ (median over those draws and
the models). *Reproduced* when the median lies within 96-99 % at some δ and within 4 % of 1
at every smaller δ; *partly* when it is within 10 % of 1 at the smallest δ but never inside
96-99 % (the curvature along the step is negative, or the grid steps over the band); *not
reproduced* otherwise; *inconclusive* when no draw predicted a decrease. The verdict names
the δ where retention lies within 96-99 % and the first δ where first order breaks (beyond
10 %).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dalign_core.bounds import b_align, b_exact_from_moments
from dalign_core.misalignment import wilson_interval
from dalign_core.report import _num

__all__ = ["PAPER_RETENTION", "Z_BINS", "SIGN_BANDS", "FIRST_ORDER_TOLERANCE", "FAILS", "single_steps",
           "conditional_decrease", "agreement", "sign_agreement", "retention_curve", "retention_verdict",
           "sign_verdict", "sign_design", "simulate_sign_verdict", "describe_sign_calibration", "block_explained",
           "theory_vs_observation", "describe_retention", "describe_sign", "describe_steps", "describe_lowest_bin",
           "describe_positive_share", "FAMILY_NAMES"]

PAPER_RETENTION = (0.96, 0.99)
CLOSE_TO_ONE = 0.04
"""Below the band, first order within 4 % (the paper's largest departure) at every smaller step."""
SIGN_BANDS = {"reproduced": 0.95, "partly": 0.80}
FIRST_ORDER_TOLERANCE = 0.10
Z_BINS = (0.0, 0.25, 0.5, 1.0, 2.0, math.inf)
"""Edges of |μ_Mᵀg_K| / sd, the statistic's size against its spread over draws."""

FAMILY_NAMES = {"llama": "LLaMA", "pythia": "Pythia", "resnet": "ResNet-20"}
"""How a family is named in a sentence."""

FAILS = {
    "sign": "fails if fewer than 80% of the draws with μ_Mᵀg_K > 0 lower the loss on evaluation examples the step "
            "never saw (what M and K share is then not what fresh examples share)",
    "retention": "fails if, on draws that predict a decrease, the median retention leaves 1 by more than 10% at the "
                 "smallest step (roundoff, kinks of ReLU, or a model that is not smooth there), or never enters 96–99% "
                 "(curvature along the step negative, or the grid steps over the band)",
}
"""What could have made each claim fail, as the claims table and the chapter state it."""

_DRAW = ["family", "model", "width", "seed", "layer", "setting", "kind", "M", "K"]


def _rate(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(share, Wilson low, Wilson high); NaN for no trials."""
    if not trials:
        return math.nan, math.nan, math.nan
    lo, hi = wilson_interval(successes, trials, confidence)
    return successes / trials, lo, hi


def _with_interval(successes: int, trials: int, confidence: float = 0.95) -> dict:
    share, lo, hi = _rate(successes, trials, confidence)
    return {"agree": share, "agree_lo": lo, "agree_hi": hi, "draws": trials}


def _column(frame: pd.DataFrame, name: str, default) -> pd.Series:
    return frame[name] if name in frame else pd.Series(default, index=frame.index)


def single_steps(table: pd.DataFrame, step: float | None = None) -> pd.DataFrame:
    """The sign study's single steps (no optimizer steps), at ``train_decrease == step`` when given."""
    if table.empty:
        return table
    sign = table[(table.study == "sign") & (_column(table, "optimizer_steps", 0) == 0)]
    return sign if step is None else sign[np.isclose(sign.train_decrease, step, rtol=1e-9)]


def _changes(frame: pd.DataFrame, on: str) -> tuple[pd.DataFrame, pd.Series, int]:
    """(rows whose sign is measured, their change, ties left out) on ``"eval"`` (E) or ``"heldout"`` (K)."""
    if on == "eval":
        tie = _column(frame, "eval_tie", False).astype(bool) | _column(frame, "eval_observed", math.nan).isna()
        kept = frame[~tie]
        return kept, kept.eval_observed, int(tie.sum())
    tie = frame.observed == 0
    kept = frame[~tie]
    return kept, kept.observed, int(tie.sum())


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
        kept, change, ties = _changes(group, on)
        positive = kept.alignment > 0
        row = {**keys}
        for name, mask in (("pos", positive), ("nonpos", ~positive)):
            n, k = int(mask.sum()), int((change[mask] < 0).sum())
            row[f"p_{name}"], row[f"p_{name}_lo"], row[f"p_{name}_hi"] = _rate(k, n, confidence)
            row[f"n_{name}"] = n
        share = _rate(int((group.alignment > 0).sum()), len(group), confidence)
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
    sign, _, _ = _changes(single_steps(table, step), on)
    sign = sign.copy()
    if sign.empty:
        return pd.DataFrame()
    spread = sign.groupby(_DRAW).alignment.transform("std")
    sign["z"] = sign.alignment.abs() / spread
    sign["z_bin"] = pd.cut(sign.z, Z_BINS, right=False).astype(str)
    sign["agrees"] = agreement(sign, on)
    rows = []
    for keys, group in sign.groupby(list(by)):
        keys = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)))
        rows.append({**keys, "z_bin": "all", **_with_interval(int(group.agrees.sum()), len(group))})
        for z_bin, part in group.groupby("z_bin", sort=False):
            rows.append({**keys, "z_bin": z_bin, **_with_interval(int(part.agrees.sum()), len(part))})
    return pd.DataFrame(rows)


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


def _sign_label(share: float, lo: float, hi: float) -> str:
    if not np.isfinite(share):
        return "inconclusive"
    if lo < SIGN_BANDS["partly"] <= SIGN_BANDS["reproduced"] <= hi:
        return "inconclusive"
    return ("reproduced" if share >= SIGN_BANDS["reproduced"] else
            "partly" if share >= SIGN_BANDS["partly"] else "not reproduced")


def _judged_steps(table: pd.DataFrame, step: float, kind: str) -> pd.DataFrame:
    """The rows a sign verdict reads: the single steps at ``step`` of the insertion ``kind``."""
    rows = single_steps(table, step)
    return rows[rows.kind == kind] if len(rows) else rows


def sign_verdict(table: pd.DataFrame, step: float, kind: str = "bias", on: str = "eval") -> dict[str, tuple[str, dict]]:
    """Family → (verdict, facts) at the single step ``step``, judged on E (``on="eval"``) by default: the facts are
    a :func:`conditional_decrease` row (``p_pos`` is P(ΔL < 0 | μ_Mᵀg_K > 0)); see the module docstring."""
    cond = conditional_decrease(_judged_steps(table, step, kind), by=("family",), on=on)
    return {r["family"]: (_sign_label(r["p_pos"], r["p_pos_lo"], r["p_pos_hi"]), r)
            for r in cond.to_dict("records")}


def sign_design(table: pd.DataFrame, step: float, kind: str = "bias") -> pd.DataFrame:
    """The sign verdict's design: per family and (model, layer, setting, M, K) cell, ``n`` the draws at the single
    step ``step`` with positive alignment whose change on E is measured (the draws the verdict counts)."""
    kept, _, _ = _changes(_judged_steps(table, step, kind), "eval")
    positive = kept[kept.alignment > 0] if len(kept) else kept
    cells = [c for c in _DRAW if c != "kind"]
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
    families = ", ".join(f"{_name(f)}: {r['sum']} positive draws in {r['size']} cells" for f, r in sizes.iterrows())
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
    block, change, _ = _changes(block[block.kind == "block"] if len(block) else block, on)
    rows = []
    for family, group in (block.groupby("family") if len(block) else ()):
        agrees = np.sign(change[group.index]) == -np.sign(group.bias_alignment)
        rows.append({"family": family, **_with_interval(int(agrees.sum()), len(group)),
                     "rank_correlation": group.alignment.rank().corr(group.bias_alignment.rank())})
    return pd.DataFrame(rows)


def _final_geometry(geometry: pd.DataFrame) -> pd.DataFrame:
    """The held-out pool's geometry at each run's final checkpoint, for the shared reduction (the bias's q)."""
    final = geometry[geometry["pool"] == "heldout"]
    if "reduction" in final:
        final = final[final.reduction == "shared"]
    return final[final.step == final.groupby(["family", "model", "seed"]).step.transform("max")]


def theory_vs_observation(table: pd.DataFrame, geometry: pd.DataFrame, step: float) -> pd.DataFrame:
    """Per model, layer, setting and budget (shared bias, single step ``step``): the share of draws with
    ``μ_Mᵀg_K > 0`` and with ``≤ 0`` (the misalignment the certificates bound), how often the step raised the loss
    on E, and B_exact, B_align and ``1 − B_align`` from the held-out pool's shared-q geometry at the final
    checkpoint (``heldout/heldout`` only: the setting the theorem covers)."""
    sign = single_steps(table, step)
    sign = sign[sign.kind == "bias"] if len(sign) else sign
    final = _final_geometry(geometry) if len(geometry) else geometry
    keys_of = ["family", "model", "width", "seed", "layer", "setting", "M", "K"]
    rows = []
    for keys, group in (sign.groupby(keys_of) if len(sign) else ()):
        key = dict(zip(keys_of, keys))
        positive = _rate(int((group.alignment > 0).sum()), len(group))
        kept, change, ties = _changes(group, "eval")
        raised = _rate(int((change > 0).sum()), len(kept))
        bound = {"b_exact": math.nan, "b_align": math.nan}
        match = final[(final.model == key["model"]) & (final.seed == key["seed"]) & (final.layer == key["layer"])]
        if key["setting"] == "heldout/heldout" and len(match):
            g = match.iloc[0]
            bound = {"b_exact": b_exact_from_moments(g.mean_sq_sq, g.directional, g.cov_energy, key["M"], key["K"]),
                     "b_align": float(b_align(max(g.d_align, 0.0), key["M"], key["K"]))}
        rows.append({**key, "share_positive": positive[0], "share_positive_lo": positive[1],
                     "share_positive_hi": positive[2], "p_misaligned": 1 - positive[0],
                     "p_misaligned_lo": 1 - positive[2], "p_misaligned_hi": 1 - positive[1],
                     "p_raised": raised[0], "p_raised_lo": raised[1], "p_raised_hi": raised[2],
                     "draws": len(group), "ties": ties, **bound, "one_minus_b_align": 1 - bound["b_align"]})
    return pd.DataFrame(rows)


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%" if np.isfinite(value) else "—"


def _interval(p: float, lo: float, hi: float) -> str:
    return f"{_percent(p)} [{_percent(lo)}, {_percent(hi)}]"


def _name(family: str) -> str:
    return FAMILY_NAMES.get(family, family)


def _steps_text(steps: list[float]) -> str:
    if not steps:
        return ""
    return f"δ = {_num(steps[0])}" if len(steps) == 1 else f"δ = {_num(steps[0])} to {_num(steps[-1])}"


def describe_retention(table: pd.DataFrame, kind: str = "bias") -> str:
    """A sentence per family: the draws predicting a decrease, the δ where the median retention lies within the
    paper's 96-99 %, where first order breaks, and the verdict."""
    lines = []
    for family, v in retention_verdict(table, kind).items():
        head = (f"- **{_name(family)}**: {v['draws']} of {v['of']} retention draws predicted a decrease "
                f"($\\mu_M^\\top g_K > 0$)")
        if not v["draws"]:
            lines.append(head + ": no retention to read: **inconclusive**.")
            continue
        step, median = v["smallest"]
        band = (f"the median retention lies within {PAPER_RETENTION[0]:.0%}–{PAPER_RETENTION[1]:.0%} at "
                f"{_steps_text(v['band'])} nats" if v["band"] else
                f"the median retention never lies within {PAPER_RETENTION[0]:.0%}–{PAPER_RETENTION[1]:.0%}")
        breaks = (f"first order breaks (beyond {FIRST_ORDER_TOLERANCE:.0%}) at δ = {_num(v['breaks_at'])} nats"
                  if np.isfinite(v["breaks_at"]) else
                  f"first order holds within {FIRST_ORDER_TOLERANCE:.0%} over the whole grid")
        lines.append(f"{head}; at the smallest step (δ = {_num(step)}) the median is {_percent(median)}; {band}; "
                     f"{breaks}: **{v['label']}**.")
    return "\n".join(lines) if lines else "No trained model was intervened on at this profile."


def describe_sign(table: pd.DataFrame, step: float, kind: str = "bias") -> str:
    """A sentence per family at the judged step: P(ΔL_E < 0 | μ_Mᵀg_K > 0) and P(ΔL_E < 0 | μ_Mᵀg_K ≤ 0) on the
    evaluation set beside the same-sample share on K, the share of positive alignment, ties, and the verdict."""
    same = sign_verdict(table, step, kind, on="heldout")
    lines = []
    for family, (label, r) in sign_verdict(table, step, kind).items():
        k = same.get(family, (None, {}))[1]
        ties = f"; {r['ties']} ties on E (within roundoff in float64) left out" if r["ties"] else "; no ties on E"
        lines.append(
            f"- **{_name(family)}** (δ = {_num(step)}): positive alignment in {_interval(r['share_positive'], r['share_positive_lo'], r['share_positive_hi'])} "
            f"of {r['draws']} draws. Of the {r['n_pos']} with $\\mu_M^\\top g_K > 0$, "
            f"{_interval(r['p_pos'], r['p_pos_lo'], r['p_pos_hi'])} lowered the loss on the evaluation examples "
            f"(on the K examples themselves: {_percent(k.get('p_pos', math.nan))}, the same-sample check); of the "
            f"{r['n_nonpos']} with $\\mu_M^\\top g_K \\le 0$, {_interval(r['p_nonpos'], r['p_nonpos_lo'], r['p_nonpos_hi'])} "
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
        parts = [f"{_percent(r.p_pos)} at δ = {_num(r.train_decrease)} ({r.n_pos} draws)" for r in single.itertuples()]
        parts += [f"{_percent(r.p_pos)} after {r.optimizer_steps} optimizer steps ({r.n_pos} draws)"
                  for r in trained.itertuples()]
        lines.append(f"- **{_name(family)}**: P(ΔL_E < 0 | $\\mu_M^\\top g_K > 0$) is " + "; ".join(parts) + ".")
    return "\n".join(lines)


def describe_positive_share(rates: pd.DataFrame) -> str:
    """The share of draws with positive alignment beside 1 − B_align (held-out/held-out, where the bound applies)."""
    covered = rates[(rates.setting == "heldout/heldout")].dropna(subset=["b_align"]) if len(rates) else rates
    if covered.empty:
        return "No held-out/held-out cell has a certificate at this profile."
    parts = []
    for family, part in covered.groupby("family"):
        above = int((part.share_positive_hi + 1e-12 >= part.one_minus_b_align).sum())
        parts.append(f"{_name(family)}: median share {_percent(part.share_positive.median())} against median "
                     f"$1 - B_{{\\mathrm{{align}}}}$ = {_percent(part.one_minus_b_align.median())}; the share's interval "
                     f"reaches $1 - B_{{\\mathrm{{align}}}}$ in {above} of {len(part)} cells")
    return ("Share of draws with $\\mu_M^\\top g_K > 0$ beside the lower bound $1 - B_{\\mathrm{align}}$ it must "
            "clear: " + "; ".join(parts) + ".")


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
            parts.append(f"{_name(family)} {_percent(low.agree)} [{_percent(low.agree_lo)}, "
                         f"{_percent(low.agree_hi)}] of {low.draws} draws (all draws: {_percent(overall.agree)})")
    if not parts:
        return ""
    return (f"Where $|\\mu_M^\\top g_K|$ is below {Z_BINS[1]:g} of its standard deviation, the signs agree in "
            + "; ".join(parts) + ".")
