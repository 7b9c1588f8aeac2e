"""What a chapter shows of its claims rows (dalign_repro.claims.chapter): the claims table's own rows, decomposed,
with the checks of the computation apart, and the rules saying what the code does."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dalign_repro.claims import chapter as cc
from dalign_repro.claims import checks
from dalign_repro.claims import table as claims
from dalign_repro.claims.rows import Row
from dalign_repro.claims.width import FEWER_THAN_TWO
from dalign_repro.config import REPO_ROOT
from dalign_repro.sweep.operating_point import misalignment_label

CPU = REPO_ROOT / "results" / "cpu"


def _committed() -> pd.DataFrame:
    if not (CPU / "claims.csv").is_file():
        pytest.skip("the committed cpu results are not present")
    return pd.read_csv(CPU / "claims.csv")


def _frame(*rows: Row) -> pd.DataFrame:
    return pd.DataFrame([row.__dict__ for row in rows])


def test_a_chapters_rows_are_the_committed_claims_rows():
    """The chapter's rows come from the code that wrote claims.csv: same labels, slopes and decomposition."""
    committed = _committed()
    rows = cc.chapter_rows(CPU, "llama")
    mine = committed[committed.scope.isin(rows.scope) & committed.claim.isin(rows.claim)]
    assert len(mine) == len(rows) and len(rows) >= 5
    both = rows.merge(mine, on=["claim", "scope"], suffixes=("", "_csv"))
    assert (both.verdict == both.verdict_csv).all() and (both.section == both.section_csv).all()
    for column in ("slope", "slope_lo", "slope_hi", "matched_slope", "clock_slope", "fail_chance"):
        np.testing.assert_allclose(both[column].astype(float), both[f"{column}_csv"].astype(float), rtol=1e-9,
                                   equal_nan=True)


def test_the_matched_loss_numbers_add_up_and_read_dashes_without_a_slope():
    committed = _committed()
    loss = committed[committed.claim == cc.MATCHED_LOSS].dropna(subset=["matched_slope"])
    assert len(loss)
    for _, row in loss.iterrows():  # matched = clock + width term, exactly
        assert math.isclose(row.matched_slope, row.clock_slope + row.slope, abs_tol=1e-9)
        said = cc.matched_loss_numbers(row)
        assert said["term"] == f"{row.slope:+.2f}".replace("-", "−") and said["label"] == row.shown
    assert set(cc.matched_loss_numbers(None).values()) - {cc.DASH} == set()
    blank = pd.Series(Row(cc.MATCHED_LOSS, "X", "", "", "not estimable", "c").__dict__)
    assert cc.matched_loss_numbers(blank)["matched"] == cc.DASH


def test_a_test_reported_once_says_why_and_only_then():
    kept = Row(cc.MATCHED_STEPS, "LLaMA", "", "", "contradicted", "c", -0.2, -0.3, -0.1, same_as=cc.MATCHED_LOSS)
    said = cc.same_as_sentence(_frame(kept))
    assert cc.MATCHED_LOSS in said and cc.MATCHED_STEPS in said and "once" in said
    assert cc.same_as_sentence(_frame(Row(cc.MATCHED_STEPS, "LLaMA", "", "", "contradicted", "c"))) == ""


def test_the_checks_table_holds_the_checks_only_each_with_its_chance_and_reason():
    committed = _committed()
    shown = cc.checks_table(committed)
    assert len(shown) == int((committed.section == checks.CHECKS).sum()) > 0
    assert (shown["why it is not a reproduction"] != cc.DASH).all()  # every kind of check says why it cannot count
    assert (shown["chance of failing"] != "not simulated").all()  # every check states its chance of failing
    assert cc.checks_table(committed[committed.section == "claims"]).empty


def test_the_same_sample_retention_cannot_fail_where_its_step_was_chosen():
    committed = _committed()
    same = committed[committed.claim == checks.SAME_SAMPLE]
    chosen = same[same.verdict == "reproduced"]
    assert len(chosen) and (chosen.fail_chance == 0).all()
    assert (chosen.alternative == checks.SAME_SAMPLE_ALTERNATIVE).all()


@pytest.mark.parametrize("lo, hi", [(-0.9, -0.1), (0.1, 0.9), (-0.1, 0.1), (-0.8, -0.6)])
def test_the_misalignment_rule_says_what_the_code_does(lo, hi):
    """The rule reads the sign: contradicted above 0, whatever the derived reference (no −0.50 threshold)."""
    rule = claims.RULES[cc.MISALIGNMENT]
    assert "above 0" in rule and "below 0" in rule and "−0.50" not in rule
    label = misalignment_label(lo, hi)
    assert label == ("reproduced" if hi < 0 else "contradicted" if lo > 0 else "inconclusive")
    assert "fixed effect per step" not in claims.RULES[cc.MATCHED_LOSS]


def test_a_context_row_says_what_it_can_and_cannot_show():
    def steps(context, ours, detectable, slope=0.1):
        return Row(cc.MATCHED_STEPS, f"LLaMA, context {context}", "", ours, "inconclusive", "c", slope, slope - 0.3,
                   slope + 0.3, detectable, context=float(context))

    rows = _frame(steps(128, "slope", 0.3), steps(512, "slope", 0.9),
                  steps(1024, f"{FEWER_THAN_TWO}: 1 of 3", math.nan, math.nan))
    runs = pd.DataFrame(dict(context=[128, 128, 512, 512, 1024, 1024], width=[32, 64] * 3,
                             trained_ok=[True, True, True, True, True, False]))
    shown = cc.context_table(rows, runs)
    assert list(shown["widths trained / run"]) == ["32, 64 of 32, 64", "32, 64 of 32, 64", "32 of 32, 64"]
    can = list(shown["can show"])
    assert "among them" in can[0] and can[1].startswith("only slopes of 0.90") and FEWER_THAN_TWO in can[2]


def test_the_reference_clause_says_when_the_measured_interval_excludes_the_implied_fall():
    row = {"scope": "LLaMA", "reference_slope": -1.40, "detectable": 1.33, "slope_lo": -0.96, "slope_hi": 0.93}
    said = cc.reference_clause(pd.Series(row))
    assert "implies a slope of −1.40, which this design can detect" in said
    assert "[−0.96, +0.93] excludes it: any fall is smaller than the paper's rise implies, at this scale." in said
    holds = cc.reference_clause(pd.Series({**row, "slope_lo": -1.6}))  # the interval holds the implied slope
    assert "excludes" not in holds and holds.endswith("(it detects 1.33 or more).")
    steeper = cc.reference_clause(pd.Series({**row, "slope_lo": -2.5, "slope_hi": -1.6}))
    assert "the fall is steeper than the paper's rise implies" in steeper


def test_the_coverage_sentence_is_the_claims_tables_own_reading():
    rows = pd.DataFrame([{"claim": cc.COVERAGE, "scope": "LLaMA", "verdict": "reproduced",
                          "ours": "p̂ on fresh examples ≤ B_exact in 68 of 68 informative cells; it can barely fail here"},
                         {"claim": cc.MISALIGNMENT, "scope": "LLaMA", "verdict": "inconclusive", "ours": "-"}])
    assert cc.coverage_sentence(rows) == ("*reproduced*: p̂ on fresh examples ≤ B_exact in 68 of 68 informative cells; "
                                          "it can barely fail here")
    assert cc.coverage_sentence(rows, "Pythia, 6 layers") == "" and cc.coverage_sentence(rows.iloc[1:]) == ""
    unrun = rows.assign(verdict="not run at this profile", ours="—")
    assert cc.coverage_sentence(unrun) == "*not run at this profile*"  # no dash left dangling after the label
