"""The studies' rows: the intervention study's sign and retention claims (§3), judged by
:mod:`dalign_repro.studies.interventions`, and the growth claim (ours), judged by
:func:`dalign_repro.studies.growth.decision`.
"""

from __future__ import annotations

from pathlib import Path

from dalign_repro.studies import growth
from dalign_repro.studies import interventions as intervention_report
from dalign_repro.studies.interventions.draws import FAMILY_NAMES
from dalign_repro.claims.rows import NOT_RUN, Row, STALE, load_current, read_current, is_stale
from dalign_repro.claims.checks import CHECKS, SAME_SAMPLE, same_sample_rows

__all__ = ["intervention_rows", "GROWTH_PAPER", "growth_rows"]


def intervention_rows(results: Path) -> list[Row]:
    (table, provenance), chapter = load_current(results, "interventions"), "05_interventions"
    claims = (("positive alignment predicts a decrease", "consistently (§3)"), ("retention at small steps", "96–99% (§3)"))
    if table is None or table.empty or "eval_observed" not in table:  # an older table: no change on fresh examples
        ours = STALE if table is not None or is_stale(results, "interventions") else "—"
        return [Row(claim, name, paper, ours, NOT_RUN, chapter) for claim, paper in claims
                for name in FAMILY_NAMES.values()] + [
            Row(SAME_SAMPLE, name, "—", ours, NOT_RUN, chapter, section=CHECKS) for name in FAMILY_NAMES.values()]
    step = provenance["config"]["sign_step"]
    rows = []
    prediction = intervention_report.sign_prediction(table, step)
    for r in prediction.itertuples():
        scope = f"{FAMILY_NAMES.get(r.family, r.family)}, {intervention_report.SETTING_NAMES.get(r.setting, r.setting)}"
        rows.append(Row(claims[0][0], scope, claims[0][1],
                        f"on fresh examples at δ = {step:g}, {r.models} models: P(fall | μ_Mᵀg_K > 0) {r.p_pos:.1%} "
                        f"[{r.p_pos_lo:.1%}, {r.p_pos_hi:.1%}] of {r.n_pos}; P(fall | ≤ 0) {r.p_nonpos:.1%} of "
                        f"{r.n_nonpos}; difference {r.difference:+.2f} [{r.difference_lo:+.2f}, "
                        f"{r.difference_hi:+.2f}]; {intervention_report.auc_text(r.auc, r.auc_lo, r.auc_hi)}; "
                        f"{r.ties} ties left out; {r.reason}", r.label, chapter))
    curve = intervention_report.out_of_sample_retention(table)
    verdicts = intervention_report.out_of_sample_verdict(curve)
    for family, v in verdicts.items():
        r = v.get("row")
        ours = v["reason"] if r is None else (
            f"on fresh examples at δ = {r['train_decrease']:g} ({r['source']} study, {r['draws']} draws predicting a "
            f"decrease): ΔL_E kept {r['from_g']:.1%} [{r['from_g_lo']:.1%}, {r['from_g_hi']:.1%}] of the prediction "
            f"from g_K ({r['from_mu']:.1%} of that from μ_M); on K {r['same_sample']:.1%} (Taylor's theorem); "
            + v["reason"])
        rows.append(Row(claims[1][0], FAMILY_NAMES.get(family, family), claims[1][1], ours, v["label"], chapter))
    checked = {r["scope"]: r for r in same_sample_rows(verdicts, FAMILY_NAMES)}
    for name in FAMILY_NAMES.values():  # the same-sample retention: Taylor's theorem at the step chosen, a check
        r = checked.get(name)
        rows.append(Row(SAME_SAMPLE, name, "—", r["ours"] if r else "—", r["verdict"] if r else NOT_RUN, chapter,
                        section=CHECKS, fail_chance=r["fail_chance"] if r else float("nan"),
                        alternative=r["alternative"] if r else ""))
    return rows


GROWTH_PAPER = "not a claim of the paper: ours, on its motivation (model growth)"


def growth_rows(results: Path) -> list[Row]:
    """The growth claim (ours, beyond the paper), one row per family, judged at the longest budget of the table by
    :func:`growth.decision`; the ρ difference (:func:`growth.verdict`) is stated beside it, not judged."""
    table, chapter = read_current(results, "growth"), "08_growth"
    if table is None or table.empty:
        ours = STALE if is_stale(results, "growth") else "—"
        return [Row(growth.CLAIM, name, GROWTH_PAPER, ours, NOT_RUN, chapter) for name in FAMILY_NAMES.values()]
    scores = growth.score(table, ["d_align", "grad_norm"])
    rows = []
    for family in [f for f in FAMILY_NAMES if f in set(table.family)]:
        judged = growth.decision(table, family=family)
        rho = growth.verdict(scores, family=family)
        ratios = ", ".join(f"{ratio:.2f}" for _, ratio in judged.ratios)
        ours = (f"{judged.reason}; spread/SE per model {ratios}" if not judged.regret else
                f"{judged.reason}; regret (nats) " + ", ".join(f"{name.replace('_', ' ')} {m:.2g} [{lo:.2g}, {hi:.2g}]"
                                                              for name, (m, lo, hi) in judged.regret.items())
                + f"; leave-one-out lower end [{judged.leave_one_out[0]:.2g}, {judged.leave_one_out[1]:.2g}]")
        if rho.label != "not run":
            ours += f"; ρ difference (d_align − gradient norm) {rho.slope:+.2f} [{rho.slope_lo:+.2f}, {rho.slope_hi:+.2f}]"
        ours += f"; {judged.of} models, {int(table.budget_steps.max())} steps"
        rows.append(Row(growth.CLAIM, FAMILY_NAMES[family], GROWTH_PAPER, ours,
                        NOT_RUN if judged.label == "not run" else judged.label, chapter))
    return rows
