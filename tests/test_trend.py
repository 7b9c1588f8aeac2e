"""Spearman width trends with a seed bootstrap, and the verdicts computed from them."""

import numpy as np
import pandas as pd
import pytest

from dalign_core.trend import spearman, verdict, width_trend


def _table(means, noise, seeds=4, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame([dict(step=0, width=w, seed=s, d_align=m + noise * rng.standard_normal())
                         for w, m in zip((32, 64, 128, 256), means) for s in range(seeds)])


def test_spearman_matches_the_rank_formula():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # 1 - 6 sum d^2 / (n (n^2 - 1)) with ranks (1,2,3,4) vs (2,1,4,3): sum d^2 = 4
    assert spearman([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(1 - 6 * 4 / (4 * 15))
    assert np.isnan(spearman([1, 2, 3], [5, 5, 5]))


def test_a_clear_rise_has_an_interval_above_zero_and_noise_does_not():
    clear = width_trend(_table([1, 2, 3, 4], noise=0.05), "d_align", ["step"])
    assert clear.rho.iloc[0] == pytest.approx(1.0) and clear.rho_lo.iloc[0] > 0 and clear.p_positive.iloc[0] == 1
    # With no trend, a 95% interval excludes 0 rarely, also at 3 seeds (resampling the 3 seeds themselves
    # would exclude it in about a quarter of tables).
    excludes = [not (t.rho_lo.iloc[0] < 0 < t.rho_hi.iloc[0]) for t in (
        width_trend(_table([1, 1, 1, 1], noise=1.0, seeds=3, seed=k), "d_align", ["step"], resamples=500)
        for k in range(100))]
    assert np.mean(excludes) <= 0.08
    assert clear.widths.iloc[0] == "32/64/128/256" and clear.n_seeds.iloc[0] == 4


def test_fewer_than_three_widths_or_one_seed_give_no_trend_and_nan_rows_are_dropped():
    table = _table([1, 2, 3, 4], noise=0.1)
    two = width_trend(table[table.width <= 64], "d_align", ["step"])
    assert np.isnan(two.rho.iloc[0]) and two.n_widths.iloc[0] == 2
    assert np.isnan(width_trend(table[table.seed == 0], "d_align", ["step"]).rho_lo.iloc[0])
    table.loc[table.width == 256, "d_align"] = np.nan
    assert width_trend(table, "d_align", ["step"]).n_widths.iloc[0] == 3


def test_the_bootstrap_is_deterministic_given_its_seed():
    table = _table([1, 1.2, 1.1, 1.3], noise=0.3)
    a = width_trend(table, "d_align", ["step"], seed=5)
    pd.testing.assert_frame_equal(a, width_trend(table, "d_align", ["step"], seed=5))


def _trend(intervals):
    return pd.DataFrame([dict(rho=(lo + hi) / 2, rho_lo=lo, rho_hi=hi) for lo, hi in intervals])


@pytest.mark.parametrize("intervals, label", [
    ([(0.2, 1.0), (0.4, 1.0)], "reproduced"),
    ([(0.2, 1.0), (-0.4, 1.0)], "partly"),
    ([(-0.2, 1.0), (-1.0, -0.4)], "not reproduced"),
    ([], "not run"),
])
def test_verdict_labels_follow_the_intervals(intervals, label):
    result = verdict(_trend(intervals), "d_align rises with width", where="checkpoints")
    assert result.label == label
    assert result.sentence.startswith(f"d_align rises with width: {label}")
    if intervals:
        assert f"at {result.holds} of {len(intervals)} checkpoints" in result.sentence


def test_a_falling_claim_mirrors_the_intervals():
    result = verdict(_trend([(-1.0, -0.2), (-1.0, 0.3)]), "misalignment falls", direction="falls")
    assert result.label == "partly" and result.holds == 1 and "below zero" in result.sentence
    with pytest.raises(ValueError, match="direction"):
        verdict(_trend([(0, 1)]), "x", direction="up")


def test_a_width_left_with_one_seed_is_left_out_of_the_trend():
    rows = [dict(width=w, seed=s, d_align=float(w) + s) for w in (8, 16, 32, 64) for s in range(3)]
    rows = [r for r in rows if not (r["width"] == 8 and r["seed"] > 0)]  # two of N=8's runs failed
    trend = width_trend(pd.DataFrame(rows).assign(layer="a"), "d_align", ["layer"], resamples=200)
    assert trend.widths.iloc[0] == "16/32/64" and trend.n_seeds.iloc[0] == 3 and trend.rho.iloc[0] == 1.0
    only_single = pd.DataFrame([dict(width=w, seed=0, d_align=float(w), layer="a") for w in (8, 16, 32)])
    assert np.isnan(width_trend(only_single, "d_align", ["layer"]).rho.iloc[0])
