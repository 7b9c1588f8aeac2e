"""The intervention experiment on the toy family's trained models, and the sentences read from its table."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from dalign_core import intervention_report as report
from dalign_core import sweep
from dalign_core.experiments import interventions
from dalign_core.experiments._runner import run_experiment
from dalign_core.results import read_table
from tests.test_sweep import ToyConfig, ToyFamily

FAMILY = ToyFamily()


def _run_toy_sweep(config, out_dir):
    return run_experiment("toy_width", sweep.tables_of(FAMILY), config,
                          lambda c, out: sweep.run_sweep(c, FAMILY), out_dir=out_dir)


TOY = dict(families=("toy",), retention_budget=(8, 8), retention_steps=(1e-6, 1e-4, 1e-2, 1.0), small_step=1e-6,
           budgets=((4, 4), (8, 8)), resamples=5)


@pytest.fixture
def toy_source(tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    source = interventions.Source(lambda profile: ToyConfig(beatable=True), _run_toy_sweep, lambda c: FAMILY)
    monkeypatch.setitem(interventions.SOURCES, "toy", source)
    return tmp_path / "results"


def _config():
    return interventions.Config(**TOY)  # after the toy source is registered


def test_both_studies_cover_every_trained_model_layer_setting_and_budget(toy_source):
    config = _config()
    out = interventions.run(config, out_dir=toy_source)
    table, _ = read_table(out, "interventions")
    required = {"family", "model", "width", "seed", "layer", "kind", "M", "K", "eta", "predicted", "observed",
                "retention", "alignment"}
    assert required <= set(table.columns)
    widths = ToyConfig().widths
    retention, sign = table[table.study == "retention"], table[table.study == "sign"]
    assert len(retention) == len(widths) * 2 * len(config.retention_steps)
    # primary and last insertion points x 2 settings x 2 budgets x resamples x 2 kinds, per width (first seed only)
    assert len(sign) == len(widths) * 2 * 2 * 2 * config.resamples * 2 and set(sign.seed) == {0}
    assert set(sign.layer) == {"blocks.0", "blocks.1"} and set(retention.layer) == {"blocks.0"}
    assert set(retention.train_decrease) == set(config.retention_steps)
    assert (sign.train_decrease == config.sign_step).all() and (table.eta > 0).all()
    smallest = retention[retention.train_decrease == 1e-6]
    assert np.allclose(smallest.retention, 1.0, atol=1e-3)  # first order holds at a tiny step (float64)
    # the curvature term explains the gap at a moderate step
    middle = retention[retention.train_decrease == 1e-2]
    assert np.allclose(middle.observed - middle.predicted, middle.second_order, rtol=0.2, atol=1e-7)
    # paired draws: every width sees the same examples, so the bias statistic of a draw differs only by the model
    assert sign.groupby(["width", "layer", "setting", "M", "K", "resample"]).bias_alignment.nunique().eq(1).all()
    bias = sign[sign.kind == "bias"]
    assert (bias.alignment == bias.bias_alignment).all()


def test_the_study_is_deterministic_and_skipped_when_current(toy_source):
    config = _config()
    first, _ = read_table(interventions.run(config, out_dir=toy_source), "interventions")
    again, _ = read_table(interventions.run(config, out_dir=toy_source, force=True), "interventions")
    pd.testing.assert_frame_equal(first, again)


def test_a_changed_sweep_makes_the_table_stale(toy_source, monkeypatch):
    config = _config()
    interventions.run(config, out_dir=toy_source)
    assert not interventions._sweeps_changed(config, toy_source)
    changed = interventions.Source(lambda profile: ToyConfig(steps=40, checkpoint_steps=(0, 20, 40)), _run_toy_sweep,
                                   lambda c: FAMILY)
    monkeypatch.setitem(interventions.SOURCES, "toy", changed)
    assert interventions._sweeps_changed(config, toy_source)


def test_failed_runs_are_left_out_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    source = interventions.Source(lambda profile: replace(ToyConfig(), beatable=False, widths=(8,), seeds=1),
                                  _run_toy_sweep, lambda c: FAMILY)
    monkeypatch.setitem(interventions.SOURCES, "toy", source)
    out = interventions.run(_config(), out_dir=tmp_path / "results")
    table, provenance = read_table(out, "interventions")
    assert table.empty
    (model,) = provenance["families"]["toy"]["models"]
    assert model["left_out"].startswith("failed run")


def test_a_bad_config_is_refused():
    with pytest.raises(ValueError, match="families"):
        interventions.Config(families=("gpt5",))
    with pytest.raises(ValueError, match="small_step"):
        interventions.Config(small_step=0.5)


def _sign_rows(alignment, observed, kind="bias", family="f"):
    n = len(alignment)
    return pd.DataFrame(dict(study="sign", family=family, model="m", width=8, seed=0, layer="l", setting="s",
                             kind=kind, M=4, K=4, alignment=alignment, bias_alignment=alignment,
                             predicted=-1e-4 * np.asarray(alignment), observed=observed, resample=range(n)))


def test_sign_verdicts_and_intervals_stay_honest_at_the_edges():
    perfect = _sign_rows([1.0, 2.0, 3.0, -1.0], [-1e-4, -2e-4, -3e-4, 1e-4])
    label, share = report.sign_verdict(perfect)["f"]
    assert label == "reproduced" and share["agree"] == 1.0 and share["agree_hi"] == 1.0 and share["agree_lo"] < 1
    wrong = _sign_rows([1.0, 2.0, 3.0], [1e-4, 2e-4, -3e-4])
    assert report.sign_verdict(wrong)["f"][0] == "not reproduced"
    bins = report.sign_agreement(perfect)
    overall = bins[bins.z_bin == "all"].iloc[0]
    assert overall.agree == 1.0 and overall.draws == 4
    assert "lowered the held-out loss: **reproduced**" in report.describe_sign(perfect)
    near_zero = _sign_rows([0.01, 2.0, 3.0, -2.0], [1e-6, -2e-4, -3e-4, 2e-4])  # curvature beats a tiny prediction
    lowest = report.describe_lowest_bin(report.sign_agreement(near_zero))
    assert "0.0% [0.0%, 79.3%] of 1 draws (all draws: 75.0%)" in lowest


def test_retention_verdict_bands():
    def rows(value):
        return pd.DataFrame(dict(study="retention", family=["a"], model="m", kind="bias", train_decrease=1e-5,
                                 retention=value))
    assert report.retention_verdict(rows(0.97), 1e-5)["a"][0] == "reproduced"
    assert report.retention_verdict(rows(1.02), 1e-5)["a"][0] == "reproduced"  # first order within 4 %, either side
    assert report.retention_verdict(rows(0.93), 1e-5)["a"][0] == "partly"
    assert report.retention_verdict(rows(0.5), 1e-5)["a"][0] == "not reproduced"
    curve = pd.DataFrame(dict(study="retention", family="a", model="m", kind="bias",
                              train_decrease=[1e-5, 1e-4, 1e-3, 1e-2], retention=[1.0, 0.98, 0.85, 0.95]))
    assert report.first_order_range(curve).largest_step.item() == 1e-4  # stops at the first step outside 10 %
