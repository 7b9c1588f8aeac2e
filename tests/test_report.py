"""The sentences a chapter prints are computed from the results tables."""

import pandas as pd

from dalign_core import report


def test_describe_runs_reports_failures_and_the_loss_trend():
    runs = pd.DataFrame(dict(width=[32, 64, 64], seed=[0, 0, 1], heldout_loss=[4.3, 4.1, 9.0],
                             trained_ok=[True, True, False]))
    text = report.describe_runs(runs)
    assert text.startswith("**1 of 3 runs failed**") and "N=64 seed 1" in text
    assert "N=32: 4.300, N=64: 4.100" in text and "falls with every increase" in text
    worse = runs.assign(heldout_loss=[4.0, 4.1, 9.0])
    assert "lowest at N=32" in report.describe_runs(worse)


def test_describe_learning_rates_flags_a_rate_at_the_edge_of_the_grid():
    lr = pd.DataFrame(dict(width=[32, 32, 64, 64, 128, 128], lr=[1e-3, 1e-2] * 3,
                           validation_loss=[5, 4, 4, 5, 4, 5], chosen=[False, True, True, False, True, False]))
    text = report.describe_learning_rates(lr)
    assert "N=32: 0.01, N=64: 0.001, N=128: 0.001" in text and "edge of that width's grid" in text
    assert "falls as width grows" in text


def _trend(pool_rho_lo):
    rows = [dict(quantity="d_align", view="matched_step", layer="L", pool="heldout", step=s, last_third=s >= 400,
                 rho=0.8, rho_lo=lo, rho_hi=1.0) for s, lo in pool_rho_lo]
    rows += [dict(quantity="p_misalign", view="budget", layer="L", setting="heldout/heldout", M=4, K=4, rho=-0.8,
                  rho_lo=-1.0, rho_hi=-0.2)]
    return pd.DataFrame(rows)


def test_width_verdicts_judge_the_last_third_only():
    early_miss = _trend([(100, -0.5), (400, 0.2), (600, 0.4)])
    steps, matched_loss, misalignment = report.width_verdicts(early_miss, "L")
    assert steps.label == "reproduced" and steps.total == 2
    assert matched_loss.label == "not run"
    assert misalignment.label == "reproduced" and "below zero" in misalignment.sentence
    assert report.width_verdicts(_trend([(400, -0.1), (600, 0.4)]), "L")[0].label == "partly"


def test_describe_bounds_counts_only_trained_runs_in_the_theorems_setting():
    table = pd.DataFrame(dict(
        setting=["heldout/heldout", "heldout/heldout", "train/heldout", "heldout/heldout"],
        p_misalign=[0.1, 0.3, 0.2, 0.9], p_misalign_lo=[0.08, 0.28, 0.18, 0.88], trials=1000,
        b_exact=[0.2, 0.25, float("nan"), 0.1], b_align=[0.3, 0.35, float("nan"), 0.1],
        trained_ok=[True, True, True, False]))
    text = report.describe_bounds(table)
    assert "2 estimates" in text and "below B_exact in 50%" in text and "below B_align in 100%" in text
    assert "No trained run" in report.describe_bounds(table.assign(trained_ok=False))


def test_describe_learning_rates_says_when_every_rate_is_bracketed():
    lr = pd.DataFrame(dict(width=[32] * 3 + [64] * 3, lr=[1e-3, 3e-3, 1e-2, 5e-4, 1.5e-3, 5e-3],
                           validation_loss=[5, 4, 5, 5, 4, 5], chosen=[False, True, False] * 2))
    assert "Every kept rate lies inside its width's grid" in report.describe_learning_rates(lr)


def test_describe_rate_resolution_flags_widths_where_seeds_differ_as_much_as_rates():
    lr = pd.DataFrame(dict(width=[32] * 3 + [256] * 3, lr=[1e-3, 3e-3, 1e-2] * 2,
                           validation_loss=[4.5, 4.1, 4.3, 4.25, 4.24, 4.32], chosen=[False, True, False] * 2))
    runs = pd.DataFrame(dict(width=[32, 32, 256, 256], heldout_loss=[4.10, 4.12, 4.16, 4.21], trained_ok=True))
    text = report.describe_rate_resolution(lr, runs)
    assert "0.200, 0.010 nats of validation loss at N = 32, 256" in text and "0.020, 0.050 nats" in text
    assert "At N=256 the seeds differ more than the two best rates do" in text and "N=32 the" not in text
