"""The width chapters' first-screen numbers and figure read exactly what the verdict reads; the cached sweep run
refuses a width or rate the sweep did not train."""

from __future__ import annotations

import math

import matplotlib
import pandas as pd
import pytest

from dalign_repro.config import REPO_ROOT
from dalign_repro.report import width_chapter as wc
from dalign_repro.report.describe.verdicts import width_verdicts
from dalign_repro.report.results import read_table
from dalign_repro.sweep.trend import Verdict, slope_test

matplotlib.use("Agg")
CPU = REPO_ROOT / "results" / "cpu"


def test_verdict_numbers_glue_signed_numbers_and_dashes():
    shown = wc.verdict_numbers(Verdict("claim", "contradicted", "s", slope=-0.1839, slope_lo=-0.3468,
                                       slope_hi=-0.021, detectable=0.2303, scale=" at this scale"))
    assert shown == dict(label="contradicted at this scale", slope="−0.18", interval="[−0.35, −0.02]",
                         detectable="0.23")
    empty = wc.verdict_numbers(Verdict("claim", "not estimable", "s", scale=" at this scale"))
    assert empty["slope"] == empty["interval"] == empty["detectable"] == "–"
    assert empty["label"] == "not estimable at this scale"


@pytest.mark.parametrize("value, text", [(0.0242, "0.0242"), (3.9, "3.9"), (3.75e-6, "3.8 × 10⁻⁶"), (5.1e5, "5.1 × 10⁵"),
                                         (0.0, "0"), (math.nan, "–")])
def test_number_reads_as_prose(value, text):
    assert wc.number(value) == text


@pytest.mark.skipif(not (CPU / "llama_geometry.csv").is_file(), reason="needs the committed cpu tables")
def test_the_figure_shows_the_runs_the_verdict_fits():
    """Refitting the slope on the figure's run means gives the verdict's slope and interval to every digit."""
    geometry, trend = read_table(CPU, "llama_geometry")[0], read_table(CPU, "llama_trend")[0]
    layer = "model.layers.0"
    verdict = width_verdicts(trend, layer, geometry=geometry, family="llama")[0]
    means = wc.late_run_means(geometry, trend, layer)
    refit = slope_test(means, 0.5)
    assert len(means) == means[["width", "seed"]].drop_duplicates().shape[0] > 3
    assert refit["slope"] == pytest.approx(verdict.slope, rel=1e-12)
    assert refit["slope_lo"] == pytest.approx(verdict.slope_lo, rel=1e-12)
    fig = wc.verdict_figure(means, verdict, reference=0.5)
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels == ["one run (seed)", "seed mean", "fitted slope", "paper's slope +0.50"]
    assert 0 < wc.magnitude(geometry, trend, layer) < 1


def test_sweep_run_refuses_a_width_or_rate_the_sweep_did_not_train():
    from dalign_repro.experiments import llama_width
    from dalign_repro.sweep.checkpoint import sweep_run

    config = llama_width.Config.for_profile("smoke")
    with pytest.raises(ValueError, match="not one of this sweep's widths"):
        sweep_run(config, llama_width.FAMILY, 1000, 0, 1e-2)
    with pytest.raises(ValueError, match="positive rate"):
        sweep_run(config, llama_width.FAMILY, config.widths[0], 0, 0.0)


def test_agreement_says_same_or_how_far_apart():
    assert wc.agreement(0.0108, 0.0108, short=True) == "the same number"
    assert wc.agreement(0.0115, 0.0108, short=True).startswith("they differ by 6.5%")
    assert "differ by 6.5%" in wc.agreement(0.0115, 0.0108)
    assert wc.agreement(0.01, math.nan, short=True) == "the table has no row for this run"


def test_a_retrained_runs_loss_gap_is_set_beside_the_seeds_spread():
    seeds = [0.40, 0.39, 0.41]  # a range of 0.02 nats
    assert wc.retrained_gap(0.4, 0.4, seeds) == ""  # the same weights: nothing to say
    far = wc.retrained_gap(0.383, 0.409, seeds)  # 0.026 nats: beyond half the range
    assert "differs from the table's by 0.026 nats" in far and "span 0.02 nats" in far
    assert "another draw" in far and "error bar across machines" in far
    near = wc.retrained_gap(0.4001, 0.4, seeds)
    assert "well within the seed spread" in near and "another draw" not in near
    assert wc.retrained_gap(0.383, 0.409, [0.4]).endswith("0.026 nats.")  # one seed: no spread to compare


def test_the_train_mean_misalignment_is_read_against_the_held_out_one_at_one_budget():
    rows = [dict(setting=s, M=m, K=m, p_misalign=p, trained_ok=True)
            for s, m, p in (("train/heldout", 32, 0.30), ("train/heldout", 32, 0.50), ("heldout/heldout", 32, 0.05),
                            ("heldout/heldout", 32, 0.05), ("train/heldout", 4, 0.9), ("heldout/heldout", 4, 0.1))]
    table = pd.DataFrame(rows)
    assert wc.train_over_heldout(table, 32, 32) == pytest.approx(8.0)  # 0.40 over 0.05: the other budget left out
    assert math.isnan(wc.train_over_heldout(table, 16, 16))  # no such budget
    failed = table.assign(trained_ok=[True, True, False, False, True, True])
    assert math.isnan(wc.train_over_heldout(failed, 32, 32))  # no trained held-out row to divide by
