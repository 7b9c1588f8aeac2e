"""What a chapter shows of its own claims rows, computed by the functions that build the claims table.

A width chapter (02 LLaMA, 03 Pythia, 04 ResNet-20, 09 the context study) calls :func:`chapter_rows` for its family
and gets the rows :func:`dalign_repro.claims.table.claims_table` would hold for it (the same code, not the CSV
parsed), then glues their numbers:

* :func:`matched_loss_numbers`: the matched-loss reading decomposed (the slope at the common held-out loss, the part
  the training clock predicts, the width term the label reads), as strings for the prose;
* :func:`same_as_sentence`: why a test reported once stands for another here (its ``same_as``);
* :func:`reference_clause` and :func:`spread_of`: the misalignment row's derived reference, and the sentence setting
  the cross-machine spread beside the seed spread;
* :func:`checks_table`: the rows of the section "checks of the computation", each with its chance of failing under
  its alternative and why it cannot count as a reproduction;
* :func:`context_table`: per context of the context study, what its rows can and cannot show (trained widths, the
  slope the design detects against the paper's).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dalign_repro.claims.certificates import certificate_rows
from dalign_repro.claims.checks import CHECKS, WHY_NOT_A_REPRODUCTION
from dalign_repro.claims.width import CROSS_MACHINE, FEWER_THAN_TWO, width_rows
from dalign_repro.sweep.trend import PAPER_SLOPE

__all__ = ["chapter_rows", "row_of", "matched_loss_numbers", "same_as_sentence", "reference_clause", "spread_of",
           "checks_table", "context_table", "coverage_sentence",
           "MATCHED_STEPS", "MATCHED_LOSS", "MISALIGNMENT", "COVERAGE"]

DASH = "–"
MATCHED_STEPS = "d_align rises with width (matched steps)"
MATCHED_LOSS = "d_align rises with width (matched loss)"
MISALIGNMENT = "misalignment falls with width at fixed (M, K)"
COVERAGE = "empirical ≤ B_exact ≤ B_align"


def chapter_rows(results: str | Path, family: str, certificates: bool = True) -> pd.DataFrame:
    """The claims table's width rows of ``family`` (``"llama"``, ``"pythia"``, ``"resnet"``, ``"llama_context"``) and,
    with ``certificates``, its certificates' rows, as :func:`~dalign_repro.claims.table.claims_table` computes them
    from the tables in ``results``. One row per (claim, scope); the claims table's columns but ``rule``."""
    rows = width_rows(Path(results), only=(family,))
    if certificates and family != "llama_context":
        rows += certificate_rows(Path(results), only=(family,))
    return pd.DataFrame([row.__dict__ for row in rows])


def _signed(value: float) -> str:
    return DASH if not math.isfinite(value) else f"{value:+.2f}".replace("-", "−")


def _interval(lo: float, hi: float) -> str:
    return DASH if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{_signed(lo)}, {_signed(hi)}]"


def row_of(rows: pd.DataFrame, claim: str, scope: str | None = None) -> pd.Series | None:
    """The row of ``claim`` (at ``scope``, or the first scope), None where the table has none."""
    part = rows[rows.claim == claim] if len(rows) else rows
    if scope is not None and len(part):
        part = part[part.scope == scope]
    return part.iloc[0] if len(part) else None



def coverage_sentence(rows: pd.DataFrame, scope: str | None = None) -> str:
    """The certificate's out-of-sample row in words, as the claims table judges it: B_exact from the held-out pool
    against p̂ resampled from evaluation examples the estimate never saw, on the informative cells only, with what a
    certificate half as large would have given ("" where the table has no such row)."""
    row = row_of(rows, COVERAGE, scope)
    if row is None:
        return ""
    ours = str(row["ours"]) if pd.notna(row["ours"]) else ""
    return f"*{row['verdict']}*" + (f": {ours}" if ours.strip("—– ") else "")  # a bare dash: nothing measured

def matched_loss_numbers(row: pd.Series | None) -> dict[str, str]:
    """The matched-loss row decomposed, as strings to glue: ``matched`` and ``matched_interval`` (the slope of log
    d_align at the common held-out loss, 95% interval over runs), ``clock`` (the part a step-only model predicts),
    ``term`` and ``term_interval`` (the width term the label reads: ``matched = clock + term``), ``label``. A dash
    where the row has no number (not estimable, not run)."""
    get = (lambda name: float(row[name]) if row is not None and pd.notna(row.get(name)) else math.nan)
    return dict(matched=_signed(get("matched_slope")),
                matched_interval=_interval(get("matched_slope_lo"), get("matched_slope_hi")),
                clock=_signed(get("clock_slope")), term=_signed(get("slope")),
                term_interval=_interval(get("slope_lo"), get("slope_hi")),
                label=str(row["shown"]) if row is not None else DASH)


def same_as_sentence(rows: pd.DataFrame) -> str:
    """One sentence per row whose ``same_as`` is set: which test reduces to which here and why it is reported once;
    "" where no test reduces to another (every row a test of its own)."""
    if not len(rows) or "same_as" not in rows:
        return ""
    said = []
    for row in rows[rows.same_as.fillna("").astype(str) != ""].itertuples(index=False):
        for other in str(row.same_as).split("/"):
            said.append(f"At {row.scope} the test of \"{other}\" gives the same estimate and interval as \"{row.claim}\" "
                        f"({_signed(row.slope)} {_interval(row.slope_lo, row.slope_hi)}), so the claims table reports "
                        "it once, in that row.")
    return " ".join(said)


def reference_clause(row: pd.Series | None, lead: bool = True) -> str:
    """The misalignment row's derived reference in words: the fall of logit p̂ the paper's d_align slope implies at
    the design's own operating point, and whether this design detects it ("" where none was derived). ``lead``:
    open with why the label reads the sign (once a chapter)."""
    if row is None or not pd.notna(row.get("reference_slope")) or not math.isfinite(float(row["reference_slope"])):
        return ""
    implied, detects = float(row["reference_slope"]), float(row["detectable"])
    can = "can" if math.isfinite(detects) and detects <= abs(implied) else "cannot"
    whose = ("the paper's d_align slope" if str(row["scope"]).startswith("LLaMA") else
             "the paper's LLaMA d_align slope (it gives none for this family)")
    text = (f"carried to this design's (M, K) and measured d_∥ and d_2, {whose} of {_signed(PAPER_SLOPE)} implies a "
            f"slope of {_signed(implied)}, which this design {can} detect (it detects {detects:.2f} or more)")
    lo, hi = (float(row.get(name, math.nan)) for name in ("slope_lo", "slope_hi"))
    if math.isfinite(lo) and math.isfinite(hi) and not lo <= implied <= hi:  # the measured interval rules it out
        text += (f"; the measured interval [{_signed(lo)}, {_signed(hi)}] excludes it: "
                 + ("any fall is smaller than the paper's rise implies, at this scale" if lo > implied else
                    "the fall is steeper than the paper's rise implies"))
    text += "."
    return ("The paper reports no slope of p̂, so the label reads the sign; " + text) if lead else \
        text[0].upper() + text[1:]


def spread_of(rows: pd.DataFrame) -> str:
    """The sentence setting the cross-machine spread beside the seed spread, once for a chapter: the row's own where
    one scope carries one, else one sentence naming each scope's seed spread ("" where no row carries one)."""
    if not len(rows) or "spread" not in rows:
        return ""
    carried = rows[rows.spread.fillna("").astype(str) != ""].drop_duplicates("scope")
    if len(carried) <= 1:
        return str(carried.spread.iloc[0]) if len(carried) else ""
    machine = CROSS_MACHINE["d_align_median"]
    seeds = " and ".join(f"{float(r.seed_spread):.0%} ({r.scope})" for r in carried.itertuples(index=False))
    ratio = float(carried.seed_spread.min()) / machine
    return (f"Across machines (LLaMA N = {CROSS_MACHINE['width']} seed {CROSS_MACHINE['seed']} retrained on another "
            f"machine) d_align per checkpoint moved by a median {machine:.1%} (at most "
            f"{CROSS_MACHINE['d_align_max']:.1%}); between two seeds of one width here d_align at one checkpoint "
            f"differs by a median {seeds}" + (
                f": the machine spread is at least {ratio:.0f}× smaller than the seed spread, which the interval over "
                "seeds already carries." if ratio > 1 else ": the machine spread is as large as a seed spread here."))


def checks_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the section "checks of the computation": check, scope, label, its chance of failing under its
    alternative, and why it cannot count as a reproduction (:data:`~dalign_repro.claims.checks.WHY_NOT_A_REPRODUCTION`).
    Empty (with those columns) where the chapter has no check."""
    columns = ["check", "scope", "label", "chance of failing", "under", "why it is not a reproduction"]
    if not len(rows) or "section" not in rows:
        return pd.DataFrame(columns=columns)
    checks = rows[rows.section == CHECKS]
    return pd.DataFrame([[row.claim, row.scope, row.shown,
                          f"{row.fail_chance:.0%}" if pd.notna(row.fail_chance) else "not simulated",
                          row.alternative or DASH, WHY_NOT_A_REPRODUCTION.get(row.claim, DASH)]
                         for row in checks.itertuples(index=False)], columns=columns)


def _can_show(steps: pd.Series | None, paper: float) -> str:
    """What one context's matched-steps row can show, from its trained widths and its detectable slope."""
    if steps is None:
        return "nothing: not run"
    ours = str(steps.ours)
    if ours.startswith(FEWER_THAN_TWO):
        return "nothing about width: " + FEWER_THAN_TWO
    if not math.isfinite(float(steps.detectable)):
        return "nothing about width: no slope could be fitted"
    if float(steps.detectable) > paper:
        return (f"only slopes of {float(steps.detectable):.2f} or more; not the paper's {_signed(paper)}, which it "
                "would miss more often than not")
    return f"slopes of {float(steps.detectable):.2f} or more, the paper's {_signed(paper)} among them"


def context_table(rows: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per context of the context study: the widths run and those that trained (beat the baseline), the
    matched-steps verdict with its slope and interval, the matched-loss width term and the clock's share, the
    slope the design detects, and what the row can and cannot show (:func:`_can_show`)."""
    columns = ["context", "widths trained / run", "matched steps", "slope [95%]", "detects", "matched loss: width term",
               "clock", "can show"]
    out = []
    for scope in dict.fromkeys(rows.scope) if len(rows) else []:
        steps, loss = row_of(rows, MATCHED_STEPS, scope), row_of(rows, MATCHED_LOSS, scope)
        context = int(steps.context) if steps is not None and pd.notna(steps.context) else None
        here = runs[runs.context == context] if context is not None and len(runs) else runs.iloc[0:0]
        trained = sorted(int(w) for w in here[here.trained_ok.astype(bool)].width.unique())
        run = sorted(int(w) for w in here.width.unique())
        decomposed = matched_loss_numbers(loss)
        out.append([f"{context:,}" if context is not None else scope,
                    f"{', '.join(map(str, trained)) or 'none'} of {', '.join(map(str, run)) or 'none'}",
                    str(steps.shown) if steps is not None else DASH,
                    f"{_signed(steps.slope)} {_interval(steps.slope_lo, steps.slope_hi)}"
                    if steps is not None and math.isfinite(float(steps.slope)) else DASH,
                    f"{float(steps.detectable):.2f}" if steps is not None and math.isfinite(float(steps.detectable))
                    else DASH,
                    f"{decomposed['term']} {decomposed['term_interval']} ({decomposed['label']})"
                    if decomposed["term"] != DASH else DASH,
                    decomposed["clock"], _can_show(steps, PAPER_SLOPE)])
    return pd.DataFrame(out, columns=columns)
