"""Every claim of the paper beside our verdict, computed from one profile's results files.

A claim is judged by the same code the chapters print their verdicts with
(:func:`dalign_repro.report.describe.width_verdicts`, :mod:`dalign_repro.studies.interventions`), so
the claims table and the chapters cannot disagree. Labels:

* **reproduced / contradicted / inconclusive / not estimable** for the width claims, a slope test whose
  verdict can go either way (:mod:`dalign_repro.sweep.trend`; each row carries its slope, interval and the smallest
  slope the design detects), against the family's own claim: the paper's +0.50 for LLaMA, the sign alone for
  Pythia and ResNet-20 (:func:`dalign_repro.report.describe.family_reference`);
* **reproduced / partly / contradicted / inconclusive** for the others, by the rule each row's ``rule`` states
  (an interval that holds a rule's threshold is inconclusive);
* **not run at this profile** when the results it needs do not exist, or do not cover
  it (the LLaMA numbers at N = 512 and 3072 exist only at the paper profile).

Every width row states its regime beside the paper's (``widths``, ``depth``, ``context`` or ``image_size``,
``train_tokens``, ``epochs``, ``d_align_median``, ``reference``, ``paper_regime``), all read from the results
files, and ``shown`` is its label as a page prints it: "… at this scale" where the regime is not the paper's.

Nothing here is typed by hand: a claim without results is "not run", never filled in.

The rows come from :mod:`~dalign_repro.claims.width`, :mod:`~dalign_repro.claims.certificates` and
:mod:`~dalign_repro.claims.studies`, on what :mod:`~dalign_repro.claims.rows` holds; this module states each claim's
rule and puts the rows together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from dalign_repro.studies import growth
from dalign_repro.studies import interventions as intervention_report
from dalign_repro.claims.certificates import COVERAGE, TRACKING, UNINFORMATIVE, certificate_rows
from dalign_repro.claims.rows import NOT_RUN, STALE, Row
from dalign_repro.claims.studies import growth_rows, intervention_rows
from dalign_repro.claims.width import LLAMA_PAPER_D_ALIGN, NUMBER_TOLERANCE, llama_numbers, width_rows

__all__ = ["NOT_RUN", "STALE", "RULES", "Row", "claims_table", "by_profile", "LLAMA_PAPER_D_ALIGN"]


RULES = {
    "d_align rises with width (matched steps)":
        "slope of each run's late-window mean of log d_align on log width: reproduced when its 95% t interval lies "
        "above 0; contradicted when it lies below the family's reference (LLaMA: the paper's slope +0.50; Pythia and "
        "ResNet-20, for which the paper gives no number: 0); inconclusive when it holds a threshold; not estimable "
        "when the interval of ‖μ‖² holds 0 at more than half the late checkpoints (checkpoints whose d_align reads "
        "0 are left out of a run's mean: no floor under the log)",
    "d_align rises with width (matched loss)":
        "each run read where its smoothed held-out loss first reaches the common level (the highest final loss of any "
        "run), log d_align interpolated between the checkpoints around that crossing (one number per run, so the "
        "interval is clustered by run); the slope there on log width is split into what a step-only model fitted on "
        "the same runs predicts (the training clock: their mean log d_align at each checkpoint, read at each run's "
        "crossing step) and the width term left, whose 95% t interval the label reads with the matched-steps "
        "thresholds (above 0 reproduced; below the family's reference contradicted; holding one inconclusive; not "
        "estimable as there). A test that reduces to another here (the same estimate and interval) is reported "
        "once, in that row (same_as)",
    "misalignment falls with width at fixed (M, K)":
        "the slope of logit p̂ on log width at the judged (M, K) (held-out/held-out, trained models), read on its "
        "sign: reproduced when its 95% t interval lies below 0, contradicted when it lies above 0, inconclusive when "
        "it holds 0 (the paper gives no slope of p̂). The reference column carries the fall the paper's d_align "
        "slope implies at the design's own (M, K) and measured d_∥, d_2; it says whether the design could detect "
        "that fall and does not move the label. Simulated at each committed design: a true slope of 0 reads "
        "contradicted at most 5% of the time, a fall the design detects reads reproduced at least 80%",
    "d_align from N = 512 to 3072": f"both within {NUMBER_TOLERANCE:.0%} of the paper's; partly when d_align rises; "
                                    "contradicted when neither holds",
    "empirical ≤ B_exact ≤ B_align":
        f"out of sample: B_exact from the held-out pool covers p̂ resampled from disjoint evaluation examples in "
        f"≥ {COVERAGE:.0%} of the (model, budget) cells whose B_exact is below {UNINFORMATIVE} (the Wilson interval "
        f"of that share above {COVERAGE:.0%}: reproduced; below: contradicted; else inconclusive). B_exact ≤ "
        "B_align is an identity and is not tested",
    "certificates track the empirical rate":
        f"rank correlation across models of B_exact with p̂ on fresh examples, median over the budgets whose median "
        f"B_exact is below {UNINFORMATIVE}, with a 95% bootstrap interval over models; the rule reads its lower end: "
        f"≥ {TRACKING['reproduced']} reproduced, ≥ {TRACKING['partly']} partly, the whole interval below "
        f"{TRACKING['partly']} contradicted, else (or when no budget's certificates are informative) inconclusive",
    "misalignment falls with M and K":
        "every model: the largest budget's interval of p̂ below the smallest's (reproduced; partly in some models; "
        "contradicted when it lies above it in every model; else inconclusive)",
    "positive alignment predicts a decrease":
        f"per family and setting, on evaluation examples the step never saw, at the judged single step: "
        f"P(ΔL_E < 0 | μ_Mᵀg_K > 0) and its difference from P(ΔL_E < 0 | ≤ 0), 95% intervals over models resampled "
        f"(at least the Wilson/Newcombe width); reproduced when the difference lies above 0 and the first reaches "
        f"{intervention_report.SIGN_BANDS['reproduced']:.0%} (partly {intervention_report.SIGN_BANDS['partly']:.0%}); "
        f"partly when the first is high and the difference lies below {intervention_report.PREDICTION_MARGIN:.0%} "
        f"(a step along μ_M helps whatever its alignment); contradicted when the first lies below "
        f"{intervention_report.SIGN_BANDS['partly']:.0%}; inconclusive when an interval holds a threshold; "
        f"{intervention_report.FAILS['sign']}",
    "retention at small steps":
        "out of sample: on draws that predict a decrease, the median of ΔL_E over the first-order prediction from "
        "g_K, at the smallest δ where first order still holds on K (the same-sample curve, Taylor's theorem, "
        "within 10% of 1), with a 95% interval over models resampled: reproduced within 1 ± 10%, contradicted "
        "outside, inconclusive holding an edge; not estimable when E was measured only where first order breaks on K",
    "retention on the same K examples":
        "on the K examples that formed g_K, at the step the retention claim reads: ΔL_K over its first-order "
        "prediction within 10% of 1 reads reproduced, else contradicted. The step is chosen where this holds (Taylor's "
        "theorem), so the row is a check of the computation, reported apart and never counted as a reproduction",
    growth.CLAIM:
        f"per grown model with at least {growth.MIN_POINTS} insertion points whose gains on held-out examples are told "
        f"apart (spread across points ≥ {growth.NOISE_RATIO:g} standard errors of one point's gain, in at least half "
        "the models), the regret of growing at d_align's top point against a random choice (its expectation) and "
        "the block-gradient norm's top point, at the longest growth budget: reproduced when both advantages' 95% t "
        "intervals over models lie above 0, contradicted when either lies below 0, inconclusive otherwise or when "
        "leaving out one model changes the label; not estimable with fewer points, inconclusive below the noise "
        "(simulated at the cpu Pythia design: with an effect ≥ 80% reproduced, without ≤ 5%)",
}
"""Each claim's rule, as the chapter states it."""


SECTIONS: tuple[Callable[[Path], list[Row]], ...] = (
    width_rows, lambda results: [llama_numbers(results)], certificate_rows, intervention_rows, growth_rows)


def claims_table(results: str | Path) -> pd.DataFrame:
    """The claims table of one profile's results folder: one row per (claim, scope), in the paper's order."""
    rows = [row for section in SECTIONS for row in section(Path(results))]
    table = pd.DataFrame([row.__dict__ for row in rows])
    return table.assign(rule=table.claim.map(RULES))


def by_profile(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (claim, scope), one verdict column per profile (``profile → claims table``).

    Rows keep the paper's order. A family that has not run at a profile has a single
    row without its regime ("Pythia"); where another profile names the regimes
    ("Pythia, 6 layers"), those rows stand for it and read "not run at this profile".
    """
    keys: list[tuple[str, str]] = []
    for table in tables.values():
        keys += [key for key in zip(table.claim, table.scope) if key not in keys]
    judged = {key for table in tables.values() for key, verdict in zip(zip(table.claim, table.scope), table.verdict)
              if verdict != NOT_RUN}  # a family's own row that was judged somewhere stays (LLaMA beside its contexts)
    specific = {(claim, scope.split(",")[0]) for claim, scope in keys if "," in scope} - judged
    keys = [key for key in keys if key not in specific]
    order = {claim: i for i, claim in enumerate(RULES)}
    keys.sort(key=lambda key: order.get(key[0], len(order)))  # stable: scopes keep their order within a claim
    columns = {name: table.set_index(["claim", "scope"]).verdict.to_dict() for name, table in tables.items()}
    return pd.DataFrame([{"claim": claim, "scope": scope,
                          **{name: verdicts.get((claim, scope), NOT_RUN) for name, verdicts in columns.items()}}
                         for claim, scope in keys])
