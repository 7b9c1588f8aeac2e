"""The misalignment claim's reference from each design's operating point, and its rule, calibrated there."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dalign_repro.config import REPO_ROOT
from dalign_repro.experiments import llama_context, llama_width, pythia_width, resnet_width
from dalign_repro.sweep import operating_point as op
from dalign_repro.sweep import trend

CPU = REPO_ROOT / "results" / "cpu"


def test_the_implied_slope_is_the_derivative_of_logit_p_under_the_papers_rise():
    """d_∥, d_2 ∝ N^0.5 scale r = B/(1 − B) as N^−0.5; with p = Φ(−r^−1/2) the slope of logit p on log N, taken by
    finite differences, is the closed form, at any B."""
    for b in (0.05, 0.2, 0.5, 0.9):
        r = b / (1 - b)

        def logit_p(log_n):
            p = stats.norm.sf((r * math.exp(-trend.PAPER_SLOPE * log_n)) ** -0.5)
            return math.log(p / (1 - p))

        numeric = (logit_p(1e-5) - logit_p(-1e-5)) / 2e-5
        assert op.implied_logit_slope(b) == pytest.approx(numeric, rel=1e-5)
    assert op.implied_logit_slope(1.0) == 0 and np.isnan(op.implied_logit_slope(0.0))
    # far steeper than −0.50 deep in the tail, flatter near a coin flip
    assert op.implied_logit_slope(0.05) < -1.5 and -0.25 < op.implied_logit_slope(0.9) < 0


@pytest.mark.parametrize("lo, hi, label", [(-0.9, -0.1, "reproduced"), (0.1, 0.9, "contradicted"),
                                           (-0.9, 0.3, "inconclusive"), (math.nan, 0.1, "not run")])
def test_the_rule_reads_the_sign(lo, hi, label):
    assert op.misalignment_label(lo, hi) == label


def _designs():
    out = [("llama", {}, llama_width.Config()), ("pythia", {"depth": 6}, pythia_width.Config()),
           ("pythia", {"depth": 12}, pythia_width.Config().sweeps()[-1]), ("resnet", {}, resnet_width.Config())]
    out += [("llama_context", {"context": s.context}, s) for s in llama_context.Config().sweeps()]
    return out


def _cells(family, regime, config):
    table = pd.read_csv(CPU / f"{family}_misalignment.csv")
    for column, value in regime.items():
        table = table[table[column] == value]
    M, K = config.budget_judged
    table = table[(table.setting == "heldout/heldout") & table.trained_ok.astype(bool) & (table.M == M)
                  & (table.K == K)]
    return table[table.layer == table.layer.iloc[0]] if len(table) else table


@pytest.mark.parametrize("family, regime, config", _designs(),
                         ids=lambda v: v if isinstance(v, str) else str(v) if isinstance(v, dict) else "")
def test_the_misalignment_rule_is_calibrated_at_each_committed_design(family, regime, config):
    """Synthetic tables at the committed design, residuals of logit p̂ drawn from the committed ones: a true slope of
    0 reads "contradicted" (and "reproduced") at most 5% of the time; a fall the design detects (1.15× its
    detectable slope) reads "reproduced" at least 80%, and the implied fall does too wherever the design detects it;
    a rise of that size reads "contradicted" at least 80%: the rule can go either way."""
    if not (CPU / f"{family}_misalignment.csv").exists():
        pytest.skip("the committed cpu results are not present")
    cells = _cells(family, regime, config)
    if cells.width.nunique() < 2:
        pytest.skip("fewer than two trained widths at this design: no slope to calibrate")
    widths = sorted(cells.width.unique())
    seeds = int(cells.groupby("width").size().median())
    residuals = op.logit_residuals(cells)
    detectable = op.design_detectable(residuals, widths, seeds)
    implied = op.implied_reference(cells)["slope"]
    design = dict(widths=widths, seeds=seeds, residuals=residuals, trials=1000)
    null = op.simulate_misalignment_labels(slope=0.0, seed=41, **design)
    assert null["contradicted"] <= 0.05 and null["reproduced"] <= 0.05, null
    found = op.simulate_misalignment_labels(slope=-1.15 * detectable, seed=42, **design)
    assert found["reproduced"] >= 0.8 and found["contradicted"] <= 0.01, found
    rises = op.simulate_misalignment_labels(slope=1.15 * detectable, seed=43, **design)
    assert rises["contradicted"] >= 0.8, rises
    if abs(implied) >= 1.15 * detectable:
        paper = op.simulate_misalignment_labels(slope=implied, seed=44, **design)
        assert paper["reproduced"] >= 0.8, paper


def test_the_old_reference_contradicted_a_flat_trend_at_context_128():
    """The old rule (contradicted above −0.50) read a true slope of 0 as "contradicted" about half the time at the
    context-128 design; the rule on the sign does so about 2.5% of the time."""
    config = next(s for s in llama_context.Config().sweeps() if s.context == 128)
    cells = _cells("llama_context", {"context": 128}, config)
    if cells.width.nunique() < 2:
        pytest.skip("fewer than two trained widths at context 128")
    widths, seeds = sorted(cells.width.unique()), int(cells.groupby("width").size().median())
    residuals = op.logit_residuals(cells)
    old = trend.simulate_labels(widths, seeds, 0.0, residuals=residuals, reference=-trend.PAPER_SLOPE, trials=1000,
                                seed=45)
    new = op.simulate_misalignment_labels(widths, seeds, 0.0, residuals, trials=1000, seed=45)
    assert old["contradicted"] >= 0.2 and new["contradicted"] <= 0.05
