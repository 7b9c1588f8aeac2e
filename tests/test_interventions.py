"""The intervention experiment on the toy family's trained models, and the sentences read from its table."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dalign_repro.studies import interventions as report
from dalign_repro.sweep import run as sweep
from dalign_repro.sweep.pools import Pools, prepare
from dalign_repro.sweep.trained import trained_model
from dalign_repro.experiments import interventions
from dalign_repro.experiments._runner import run_experiment
from dalign_core.geometry.misalignment import wilson_interval
from dalign_repro.report.results import read_table
from tests.test_sweep import ToyConfig, ToyFamily

FAMILY = ToyFamily()


def _run_toy_sweep(config, out_dir):
    return run_experiment("toy_width", sweep.tables_of(FAMILY), config,
                          lambda c, out: sweep.run_sweep(c, FAMILY), out_dir=out_dir)


TOY = dict(families=("toy",), retention_budget=(8, 8), retention_draws=3, retention_steps=(1e-6, 1e-4, 1e-2, 1.0),
           budgets=((4, 4), (8, 8)), resamples=5, sign_steps=(1e-3, 1e-1), sign_step=1e-3, optimizer_steps=(2, 5),
           optimizer_resamples=2)


@pytest.fixture(scope="module")
def _toy_sweep(tmp_path_factory) -> Path:
    """The toy sweep the studies read, trained once for this file: ``results/`` (its tables) and ``checkpoints/``."""
    root = tmp_path_factory.mktemp("toy-sweep")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DALIGN_CHECKPOINTS", str(root / "checkpoints"))
        _run_toy_sweep(ToyConfig(beatable=True), root / "results")
    return root


@pytest.fixture
def toy_source(tmp_path, monkeypatch, _toy_sweep):
    """A results folder holding a copy of the toy sweep's tables (current, so a study does not train it again) and
    its checkpoints beside it, with the toy family registered as the studies' only source."""
    shutil.copytree(_toy_sweep / "results", tmp_path / "results")
    shutil.copytree(_toy_sweep / "checkpoints", tmp_path / "checkpoints")
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    source = interventions.Source(lambda profile: ToyConfig(beatable=True), _run_toy_sweep, lambda c: FAMILY)
    monkeypatch.setitem(interventions.SOURCES, "toy", source)
    return tmp_path / "results"


def _config():
    return interventions.Config(**TOY)  # after the toy source is registered


def test_both_studies_cover_every_trained_model_layer_setting_and_budget(toy_source):
    config = _config()
    out = interventions.run(config, out_dir=toy_source)
    table, provenance = read_table(out, "interventions")
    required = {"family", "model", "width", "seed", "layer", "kind", "M", "K", "eta", "predicted", "observed",
                "retention", "alignment", "eval_observed", "eval_predicted", "eval_n", "optimizer_steps", "eval_tie",
                "eval_float64"}
    assert required <= set(table.columns)
    widths = ToyConfig().widths
    retention, sign = table[table.study == "retention"], table[table.study == "sign"]
    assert len(retention) == len(widths) * 2 * config.retention_draws * len(config.retention_steps)
    # single steps: primary and last insertion points x 2 settings x 2 budgets x resamples x 2 kinds x steps
    single = sign[sign.optimizer_steps == 0]
    assert len(single) == len(widths) * 2 * 2 * 2 * config.resamples * 2 * len(config.sign_steps)
    assert set(sign.seed) == {0}
    # optimizer steps: the primary layer only, the first optimizer_resamples draws, each count
    trained = sign[sign.optimizer_steps > 0]
    assert len(trained) == len(widths) * 1 * 2 * 2 * config.optimizer_resamples * 2 * len(config.optimizer_steps)
    assert set(trained.layer) == {"blocks.0"} and set(trained["resample"]) == set(range(config.optimizer_resamples))
    assert set(trained.optimizer_steps) == set(config.optimizer_steps)
    assert set(sign.layer) == {"blocks.0", "blocks.1"} and set(retention.layer) == {"blocks.0"}
    assert set(retention.train_decrease) == set(config.retention_steps)
    assert set(single.train_decrease) == set(config.sign_steps) and (table.eta > 0).all()
    # E: the sweep's evaluation examples, all of them, on every sign row; none in the retention study
    assert (sign.eval_n == ToyConfig().eval_examples).all() and sign.eval_observed.notna().all()
    assert (retention.eval_n == 0).all() and retention.eval_observed.isna().all()
    (facts,) = provenance["families"]["toy"]["evaluation"]["sets"]
    assert facts == {"examples": ToyConfig().eval_examples, "of": ToyConfig().eval_examples}
    # E is not K: the change on E differs from the change on K, and first order on E is its own gradient's
    assert not np.allclose(single.eval_observed, single.observed)
    small = single[single.train_decrease == 1e-3]
    assert np.corrcoef(small.eval_observed, small.eval_predicted)[0, 1] > 0.98
    assert ((small.eval_observed - small.eval_predicted).abs() / small.eval_predicted.abs()).median() < 0.1
    # an optimizer-step row belongs to the same draw as that draw's single steps (the same alignment)
    keys = ["width", "layer", "setting", "M", "K", "resample", "kind"]
    merged = trained.merge(single[single.train_decrease == 1e-3][keys + ["alignment"]], on=keys, suffixes=("", "_1"))
    assert len(merged) == len(trained) and (merged.alignment == merged.alignment_1).all()
    smallest = retention[retention.train_decrease == 1e-6]
    assert np.allclose(smallest.retention, 1.0, atol=1e-3)  # first order holds at a tiny step (float64)
    # the curvature term explains the gap at a moderate step
    middle = retention[retention.train_decrease == 1e-2]
    assert np.allclose(middle.observed - middle.predicted, middle.second_order, rtol=0.2, atol=1e-7)
    # paired draws: every width sees the same examples, so the bias statistic of a draw differs only by the model
    keys = ["width", "layer", "setting", "M", "K", "resample", "train_decrease", "optimizer_steps"]
    assert sign.groupby(keys).bias_alignment.nunique().eq(1).all()
    bias = sign[sign.kind == "bias"]
    assert (bias.alignment == bias.bias_alignment).all()


def test_the_evaluation_set_is_disjoint_from_the_draws(toy_source):
    """E is the sweep's evaluation examples: test indices outside the held-out pool, which every K (and the M of
    heldout/heldout) is drawn from; the M of train/heldout come from the train split."""
    sweep_config = ToyConfig(beatable=True)
    splits, _, pools = prepare(sweep_config, FAMILY)
    evaluation, index = interventions.evaluation_set(splits, pools, None)
    assert len(index) == sweep_config.eval_examples
    assert not set(index.tolist()) & set(pools.heldout.tolist())
    assert torch.equal(evaluation[0], splits.test[0][index])
    n_train, n_heldout = len(pools.train), len(pools.heldout)
    for setting in interventions.SETTINGS:
        train_idx, heldout_idx, source = interventions._draw(setting, n_train, n_heldout, 8, 8, (0, setting, 8, 8, 1))
        heldout_examples = set(pools.heldout[heldout_idx].tolist())
        assert not heldout_examples & set(index.tolist())
        if source == "heldout":
            assert not set(pools.heldout[train_idx].tolist()) & (heldout_examples | set(index.tolist()))
    limited = interventions.evaluation_set(splits, pools, 10)[1]
    assert torch.equal(limited, index[:10])
    overlapping = Pools(train=pools.train, heldout=pools.heldout, evaluation=pools.heldout[:4],
                              validation=pools.validation)
    with pytest.raises(RuntimeError, match="shares 4 examples"):
        interventions.evaluation_set(splits, overlapping, None)


def test_eval_observed_is_the_change_of_the_loss_on_the_evaluation_set(toy_source):
    """Recompute one row's ΔL_E by hand: the model's mean loss on E with the bias −η μ_M added at the layer, minus
    without."""
    config = _config()
    table, _ = read_table(interventions.run(config, out_dir=toy_source), "interventions")
    row = table[(table.study == "sign") & (table.kind == "bias") & (table.layer == "blocks.0")
                & (table.setting == "train/heldout") & (table.M == 4) & (table["resample"] == 1)
                & (table.train_decrease == 1e-1) & (table.optimizer_steps == 0)].iloc[0]
    sweep_config = ToyConfig(beatable=True)
    splits, _, pools = prepare(sweep_config, FAMILY)
    model = trained_model(sweep_config, FAMILY, splits, int(row.width), int(row.seed), float(row.lr))
    train_idx, _, _ = interventions._draw("train/heldout", len(pools.train), len(pools.heldout), 4, 4,
                                          (config.seed, "train/heldout", 4, 4, 1))
    x_m, y_m = splits.train[0][pools.train[train_idx]], splits.train[1][pools.train[train_idx]]
    x_e, y_e = interventions.evaluation_set(splits, pools, None)[0]
    module = dict(model.named_modules())["blocks.0"]
    bias = torch.zeros(int(row.width), requires_grad=True)
    handle = module.register_forward_hook(lambda m, a, out: out + bias)
    try:
        loss = torch.nn.functional.cross_entropy(model(x_m), y_m)
        (mu,) = torch.autograd.grad(loss, bias)
        with torch.no_grad():
            before = torch.nn.functional.cross_entropy(model(x_e), y_e)
            bias.copy_(-row.eta * mu)
            after = torch.nn.functional.cross_entropy(model(x_e), y_e)
    finally:
        handle.remove()
    assert float(after - before) == pytest.approx(row.eval_observed, rel=1e-3, abs=1e-6)
    assert row.eval_observed != pytest.approx(row.observed, rel=1e-2)


def test_the_study_is_deterministic_and_skipped_when_current(toy_source):
    config = _config()
    first, _ = read_table(interventions.run(config, out_dir=toy_source), "interventions")
    again, _ = read_table(interventions.run(config, out_dir=toy_source, force=True), "interventions")
    pd.testing.assert_frame_equal(first, again)


def test_an_interrupted_study_resumes_from_its_finished_models(toy_source, monkeypatch):
    """Each model's rows are kept as a job until the table is written: a rerun computes only the models left."""
    monkeypatch.setenv("DALIGN_WORKERS", "1")  # one process: the interruption falls after the first model
    config = _config()
    whole, _ = read_table(interventions.run(config, out_dir=toy_source / "whole"), "interventions")
    computed, real = [], interventions.model_rows

    def interrupted(*args, **kwargs):
        if computed:
            raise KeyboardInterrupt
        computed.append(args[-1]["model"])
        return real(*args, **kwargs)

    monkeypatch.setattr(interventions, "model_rows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        interventions.run(config, out_dir=toy_source)
    kept = list((toy_source / "partial").glob("interventions-*/*.json"))
    assert len(kept) == 1 and computed[0] in kept[0].name
    again = []
    monkeypatch.setattr(interventions, "model_rows", lambda *a, **k: again.append(a[-1]["model"]) or real(*a, **k))
    resumed, record = read_table(interventions.run(config, out_dir=toy_source), "interventions")
    assert computed[0] not in again and len(again) == whole.model.nunique() - 1
    pd.testing.assert_frame_equal(whole, resumed)
    # the provenance says the wall time covers only the rest (the toy sweep's own jobs are not counted)
    assert record["resumed"] == {"jobs_reused": 1, "jobs": whole.model.nunique()}
    assert "resumed" not in read_table(toy_source / "whole", "interventions")[1]
    assert not (toy_source / "partial").exists()  # the jobs are gone once the table holds them


def test_a_changed_sweep_makes_the_table_stale(toy_source, monkeypatch):
    config = _config()
    interventions.run(config, out_dir=toy_source)
    assert not interventions.sweeps_changed("interventions", config, toy_source, interventions.SOURCES)
    changed = interventions.Source(lambda profile: ToyConfig(steps=40, checkpoint_steps=(0, 20, 40)), _run_toy_sweep,
                                   lambda c: FAMILY)
    monkeypatch.setitem(interventions.SOURCES, "toy", changed)
    assert interventions.sweeps_changed("interventions", config, toy_source, interventions.SOURCES)


def test_models_of_unchanged_sweeps_are_taken_from_the_table(toy_source, monkeypatch):
    """A study recomputed because some family's sweep changed takes the rows of the families whose sweep did not
    change from its table, exactly (the table written again is the same); ``force`` recomputes every model, and a
    family whose sweep hash differs is recomputed."""
    import json

    monkeypatch.setenv("DALIGN_WORKERS", "1")  # the models computed in this process, where they are counted
    config = _config()
    first, _ = read_table(interventions.run(config, out_dir=toy_source), "interventions")
    csv_before = (toy_source / "interventions.csv").read_bytes()
    computed, real = [], interventions.model_rows
    monkeypatch.setattr(interventions, "model_rows", lambda *a, **k: computed.append(a[-1]["model"]) or real(*a, **k))
    monkeypatch.setattr(interventions, "sweeps_changed", lambda *a: True)  # as if another family's sweep changed

    interventions.run(config, out_dir=toy_source)
    assert computed == [] and (toy_source / "interventions.csv").read_bytes() == csv_before
    provenance = json.loads((toy_source / "interventions.json").read_text())
    ran = [m for m in provenance["families"]["toy"]["models"] if "left_out" not in m]
    assert ran and all(m["reused_from"]["written_utc"] for m in ran)

    provenance["families"]["toy"]["sweep_models_hash"] = "another sweep"
    (toy_source / "interventions.json").write_text(json.dumps(provenance))
    interventions.run(config, out_dir=toy_source)
    assert len(computed) == len(ran)
    forced, _ = read_table(interventions.run(config, out_dir=toy_source, force=True), "interventions")
    assert len(computed) == 2 * len(ran)
    pd.testing.assert_frame_equal(first, forced)


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
    with pytest.raises(ValueError, match="sign_step"):
        interventions.Config(sign_step=0.5)
    with pytest.raises(ValueError, match="optimizer_steps"):
        interventions.Config(optimizer_steps=(0,))
    with pytest.raises(ValueError, match="retention_eval_steps"):
        interventions.Config(retention_eval_steps=(5e-4,))
    with pytest.raises(ValueError, match="retention_eval_kinds"):
        interventions.Config(retention_eval_kinds=("gate",))
    # lab takes smoke's grid with twice its draws and measures on E a subset of its steps, the shared bias only, as
    # cpu does
    lab, smoke = interventions.Config.for_profile("lab"), interventions.Config.for_profile("smoke")
    assert lab.retention_eval_kinds == ("bias",) and lab.optimizer_steps == smoke.optimizer_steps
    assert set(lab.retention_eval_steps) < set(lab.retention_steps) == set(smoke.retention_steps)
    assert lab.budgets == smoke.budgets and lab.retention_budget == smoke.retention_budget
    assert (lab.retention_draws, lab.resamples, lab.optimizer_resamples) == (
        2 * smoke.retention_draws, 2 * smoke.resamples, 2 * smoke.optimizer_resamples)


def test_retention_draws_by_family_sets_a_familys_draws_and_keeps_the_others_draws(toy_source, tmp_path):
    """A family's own count adds draws after the common ones: draw r is seeded by its index, so the first draws (and
    every sign row) are the same numbers at either count."""
    light = dict(TOY, budgets=((4, 4),), resamples=1, optimizer_resamples=0, retention_steps=(1e-4, 1e-2))
    tables = {}
    for draws in (None, 5):
        config = interventions.Config(**light, retention_draws_by_family=(("toy", draws),) if draws else ())
        assert config.retention_draws_of("toy") == (draws or TOY["retention_draws"])
        out = interventions.run(config, out_dir=tmp_path / f"draws-{draws}")
        tables[draws] = read_table(out, "interventions")[0]
    common, more = tables[None], tables[5]
    retention = more[more.study == "retention"]
    assert set(retention["resample"]) == set(range(5))
    first = retention[retention["resample"] < TOY["retention_draws"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(first, common[common.study == "retention"].reset_index(drop=True))
    pd.testing.assert_frame_equal(more[more.study == "sign"].reset_index(drop=True),
                                  common[common.study == "sign"].reset_index(drop=True))
    with pytest.raises(ValueError, match="retention_draws_by_family"):
        interventions.Config(**light, retention_draws_by_family=(("toy", 0),))


def _sign_rows(alignment, observed, kind="bias", family="f", eval_observed=None, tie=None, step=1e-3):
    n = len(alignment)
    eval_observed = observed if eval_observed is None else eval_observed
    return pd.DataFrame(dict(study="sign", family=family, model="m", width=8, seed=0, layer="l", setting="s",
                             kind=kind, M=4, K=4, alignment=alignment, bias_alignment=alignment,
                             predicted=-1e-4 * np.asarray(alignment), observed=observed, eval_observed=eval_observed,
                             eval_tie=False if tie is None else tie, train_decrease=step, optimizer_steps=0,
                             resample=range(n)))


def test_sign_is_judged_on_the_evaluation_set_not_on_k():
    # On K every step agrees with its alignment (Taylor); on E two of three positive draws raised the loss.
    rows = _sign_rows([1.0, 2.0, 3.0, -1.0], [-1e-4, -2e-4, -3e-4, 1e-4], eval_observed=[-1e-4, 2e-4, 3e-4, 1e-4])
    label, r = report.sign_verdict(rows, 1e-3)["f"]
    assert r["n_pos"] == 3 and r["p_pos"] == pytest.approx(1 / 3) and label == "not reproduced"
    assert report.sign_verdict(rows, 1e-3, on="heldout")["f"][1]["p_pos"] == 1.0
    assert r["p_nonpos"] == 0.0 and r["n_nonpos"] == 1
    assert (r["p_pos_lo"], r["p_pos_hi"]) == pytest.approx(wilson_interval(1, 3))
    assert (r["p_nonpos_lo"], r["p_nonpos_hi"]) == pytest.approx(wilson_interval(0, 1))
    assert r["share_positive"] == 0.75 and (r["share_positive_lo"], r["share_positive_hi"]) == pytest.approx(
        wilson_interval(3, 4))
    text = report.describe_sign(rows, 1e-3)
    assert "33.3% [" in text and "100.0%, the same-sample check" in text and "**not reproduced**" in text
    # another step or an optimizer-step row does not enter the judged step's verdict
    other = _sign_rows([1.0], [-1e-4], eval_observed=[-1e-4], step=1e-2)
    trained = _sign_rows([1.0], [-1e-4], eval_observed=[-1e-4]).assign(optimizer_steps=10)
    assert report.sign_verdict(pd.concat([rows, other, trained]), 1e-3)["f"][1]["n_pos"] == 3


def test_ties_on_e_are_left_out_and_counted():
    rows = _sign_rows([1.0, 2.0, 3.0, -1.0], [-1e-4] * 3 + [1e-4], eval_observed=[-1e-4, 0.0, -3e-4, 1e-4],
                      tie=[False, True, False, False])
    label, r = report.sign_verdict(rows, 1e-3)["f"]
    assert r["ties"] == 1 and r["n_pos"] == 2 and r["p_pos"] == 1.0 and r["draws"] == 4
    assert label == "inconclusive"  # 2 of 2: the Wilson interval holds both 80% and 95%
    assert "1 ties on E" in report.describe_sign(rows, 1e-3)
    cond = report.conditional_decrease(rows)
    assert cond.ties.item() == 1 and cond.share_positive.item() == 0.75


def test_sign_verdicts_and_intervals_stay_honest_at_the_edges():
    many = _sign_rows([1.0] * 100 + [-1.0], [-1e-4] * 100 + [1e-4])
    label, r = report.sign_verdict(many, 1e-3)["f"]
    assert label == "reproduced" and r["p_pos"] == 1.0 and r["p_pos_hi"] == 1.0 and r["p_pos_lo"] < 1
    wrong = _sign_rows([1.0] * 50, [1e-4] * 30 + [-1e-4] * 20)
    assert report.sign_verdict(wrong, 1e-3)["f"][0] == "not reproduced"
    perfect = _sign_rows([1.0, 2.0, 3.0, -1.0], [-1e-4, -2e-4, -3e-4, 1e-4])
    bins = report.sign_agreement(perfect, 1e-3)
    overall = bins[bins.z_bin == "all"].iloc[0]
    assert overall.agree == 1.0 and overall.draws == 4
    near_zero = _sign_rows([0.01, 2.0, 3.0, -2.0], [1e-6, -2e-4, -3e-4, 2e-4])  # curvature beats a tiny prediction
    lowest = report.describe_lowest_bin(report.sign_agreement(near_zero, 1e-3))
    assert "0.0% [0.0%, 79.3%] of 1 draws (all draws: 75.0%)" in lowest


def _retention_rows(curves, alignment):
    """One retention row per (draw, δ): ``curves[d]`` the retention of draw d along ``STEPS``."""
    rows = []
    for draw, (curve, a) in enumerate(zip(curves, alignment)):
        for step, value in zip(STEPS, curve):
            rows.append(dict(study="retention", family="a", model="m", kind="bias", resample=draw,
                             train_decrease=step, predicted=-step * a, retention=value, observed=-step * a * value))
    return pd.DataFrame(rows)


STEPS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)


def test_retention_is_read_only_on_draws_that_predict_a_decrease():
    # The draw with negative alignment has retention 1.0 everywhere; were it read, the median would change.
    rows = _retention_rows([[1.0, 0.995, 0.97, 0.85, 0.3], [1.0, 0.99, 0.96, 0.8, 0.2], [1.0, 1.0, 1.0, 1.0, 1.0]],
                           [1.0, 2.0, -1.0])
    curve = report.retention_curve(rows)
    assert (curve.draws == 2).all() and (curve.of == 3).all()
    assert curve.set_index("train_decrease")["median"][1e-3] == pytest.approx(0.965)
    v = report.retention_verdict(rows)["a"]
    assert v["label"] == "reproduced" and v["band"] == [1e-3] and v["breaks_at"] == 1e-2 and v["draws"] == 2
    text = report.describe_retention(rows)
    assert "2 of 3 retention draws" in text and "at δ = 0.001 nats" in text and "breaks" in text
    assert "Taylor's theorem's check of the computation: reproduced" in text and "**reproduced**" not in text
    only_negative = _retention_rows([[1.0] * 5], [-1.0])
    assert report.retention_verdict(only_negative)["a"]["label"] == "inconclusive"
    assert "no retention to read" in report.describe_retention(only_negative)


def test_retention_verdict_bands():
    def verdict(curve):
        return report.retention_verdict(_retention_rows([curve], [1.0]))["a"]
    assert verdict([1.0, 0.99, 0.97, 0.9, 0.5])["label"] == "reproduced"
    assert verdict([1.0, 1.01, 1.03, 1.2, 2.0])["label"] == "partly"  # negative curvature: never inside 96-99 %
    assert verdict([1.0, 0.995, 0.5, 0.2, 0.1])["label"] == "partly"  # the grid steps over the band
    assert verdict([1.0, 0.93, 0.97, 0.9, 0.5])["label"] == "partly"  # left 1 by more than 4% before the band
    assert verdict([0.5, 0.6, 0.97, 0.9, 0.5])["label"] == "not reproduced"  # first order off at the smallest step
    assert np.isnan(verdict([1.0, 1.0, 0.99, 0.98, 0.97])["breaks_at"])


def test_the_sweeps_run_on_every_rank_before_the_rank_0_part(tmp_path, monkeypatch):
    """Under torchrun only rank 0 computes the interventions; the sweeps they read share their jobs over every
    rank, so they must run first on all of them (a sweep started by rank 0 alone waited on ranks that had left)."""
    calls = []
    for name, source in interventions.SOURCES.items():
        monkeypatch.setitem(interventions.SOURCES, name, replace(
            source, run=lambda config, out_dir=None, name=name: calls.append(("sweep", name)) or out_dir))
    monkeypatch.setattr(interventions, "run_experiment",
                        lambda name, tables, config, compute, **kw: calls.append(("rank 0 part", name)))
    interventions.run(interventions.Config.for_profile("smoke"), out_dir=tmp_path)
    assert calls == [("sweep", "llama"), ("sweep", "pythia"), ("sweep", "resnet"), ("rank 0 part", "interventions")]


def test_only_rank_0_removes_a_studys_kept_models(tmp_path, monkeypatch):
    """Under torchrun every rank calls run(), and the others return while rank 0 still computes into the folder."""
    from dalign_repro.experiments import _models

    config = interventions.Config.for_profile("smoke")
    folder = _models.jobs_folder("interventions", config, tmp_path)
    folder.mkdir(parents=True)
    (folder / "kept.json").write_text("{}")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    _models.remove_model_jobs("interventions", config, tmp_path)
    assert (folder / "kept.json").is_file()
    monkeypatch.setenv("RANK", "0")
    _models.remove_model_jobs("interventions", config, tmp_path)
    assert not folder.exists() and not (tmp_path / "partial").exists()


def test_the_sign_verdict_is_calibrated_at_the_committed_cpu_design():
    """At the cpu design's cells (a family's draws share models, layers and E, so they are not independent: each
    cell draws its own rate about the family's), when 98% of positive draws lower the loss on E "reproduced" comes
    out most of the time; when 85% do (short of "consistently") or half do (no effect), at most 5% of the time."""
    from dalign_repro.config import REPO_ROOT

    table, provenance = read_table(REPO_ROOT / "results" / "cpu", "interventions")
    design = report.sign_design(table, provenance["config"]["sign_step"])
    assert design.groupby("family").n.sum().min() >= 40, design.groupby("family").n.sum()
    labels = {rate: report.simulate_sign_verdict(design, rate) for rate in (0.98, 0.85, 0.5)}
    assert labels[0.98].get("reproduced", 0) >= 0.8
    for rate in (0.85, 0.5):
        assert labels[rate].get("reproduced", 0) <= 0.05, (rate, labels[rate])
    assert labels[0.5].get("not reproduced", 0) >= 0.95
    text = report.describe_sign_calibration(design)
    assert "What the sign rule can detect" in text and "positive draws in" in text


def test_the_sign_design_counts_the_draws_the_verdict_counts():
    rows = _sign_rows([1.0, 2.0, -1.0, 3.0], [-1.0] * 4, eval_observed=[-1.0, 1.0, -1.0, 0.0],
                      tie=[False, False, False, True])
    design = report.sign_design(pd.concat([rows, rows.assign(layer="m2"), rows.assign(kind="block")]), 1e-3)
    assert design.n.tolist() == [2, 2] and design.layer.tolist() == ["l", "m2"]
    assert report.sign_design(rows.iloc[0:0], 1e-3).empty
    assert "not simulated" in report.describe_sign_calibration(report.sign_design(rows.iloc[0:0], 1e-3))


def _predict_rows(pos_fell, non_fell, models=("m1", "m2", "m3", "m4", "m5")):
    """Draws spread over ``models``: ``pos_fell``/``non_fell`` the falls (True) of positive and non-positive draws."""
    n_pos, n_non = len(pos_fell), len(non_fell)
    alignment = np.r_[np.linspace(1, 2, n_pos), -np.linspace(1, 2, n_non)]
    fell = np.r_[pos_fell, non_fell].astype(bool)
    rows = _sign_rows(alignment, -1e-4 * alignment, eval_observed=np.where(fell, -1e-4, 1e-4))
    return rows.assign(model=[models[i % len(models)] for i in range(len(rows))], setting="train/heldout")


def test_the_sign_as_a_prediction_needs_a_difference_between_the_conditionals():
    # 98 of 100 positive draws fall and 20 of 40 non-positive: the sign tells a fall from a rise
    informative = report.sign_prediction(_predict_rows([True] * 98 + [False] * 2, [True, False] * 20), 1e-3).iloc[0]
    assert informative.p_pos == pytest.approx(0.98) and informative.p_nonpos == pytest.approx(0.5)
    assert informative.difference == pytest.approx(0.48) and informative.difference_lo > 0
    assert informative.label == "reproduced" and informative.models == 5
    # every draw falls: a high first conditional with no difference is "partly", whatever the alignment
    whatever = report.sign_prediction(_predict_rows([True] * 100, [True] * 100), 1e-3).iloc[0]
    assert whatever.difference == 0 and whatever.difference_hi < report.PREDICTION_MARGIN
    assert whatever.label == "partly" and "whatever its alignment" in whatever.reason
    # a first conditional below 80% whose interval stays below it contradicts "consistently"
    coin = report.sign_prediction(_predict_rows([True, False] * 50, [True, False] * 50), 1e-3).iloc[0]
    assert coin.label == "contradicted" and coin.auc == pytest.approx(0.5, abs=0.1)
    # the AUC is the Mann-Whitney statistic: the falls are exactly the draws of largest alignment here
    ordered = report.sign_prediction(_predict_rows([True] * 50, [False] * 50), 1e-3).iloc[0]
    assert ordered.auc == pytest.approx(1.0)
    # few draws: the interval holds both 80% and 95%
    assert report.sign_prediction(_predict_rows([True] * 4, [False] * 4), 1e-3).label.item() == "inconclusive"
    text = report.describe_prediction(report.sign_prediction(_predict_rows([True] * 98 + [False] * 2,
                                                                          [True, False] * 20), 1e-3))
    assert "train/held-out" in text and "**reproduced**" in text and "+48.0 points" in text


def test_the_prediction_rule_is_calibrated_at_the_committed_cpu_design():
    """With an effect (98% of positive draws fall, 50% of the others) "reproduced" comes out most of the time;
    when a step helps whatever its alignment (98% both) or the sign tells nothing (50% both), at most 5%."""
    from dalign_repro.config import REPO_ROOT

    table, provenance = read_table(REPO_ROOT / "results" / "cpu", "interventions")
    design = report.prediction_design(table, provenance["config"]["sign_step"])
    assert design.groupby(["family", "setting"]).n_pos.sum().min() >= 20
    effect = report.simulate_prediction_verdict(design, 0.98, 0.5, trials=40)
    assert effect.get("reproduced", 0) >= 0.8, effect
    for rates in ((0.98, 0.98), (0.5, 0.5), (0.9, 0.9)):
        found = report.simulate_prediction_verdict(design, *rates, trials=40)
        assert found.get("reproduced", 0) <= 0.05, (rates, found)


def test_out_of_sample_retention_is_judged_where_first_order_holds_on_k():
    """Retention on E (the prediction from g_K against ΔL_E) is read at the smallest δ where the same-sample curve
    is within 10% of 1; where it breaks at every δ measured on E the verdict is not estimable."""
    rows = []
    for m in range(4):
        for d, (same, on_e) in {1e-5: (1.0, 0.5), 1e-3: (0.7, 0.4)}.items():
            for r in range(5):
                predicted = -d * (1 + r)
                rows.append(dict(study="retention", family="f", model=f"m{m}", seed=0, setting="train/heldout",
                                 kind="bias", optimizer_steps=0, train_decrease=d, predicted=predicted,
                                 observed=same * predicted, eval_observed=on_e * predicted, eval_tie=False,
                                 step_fraction=np.nan))
    table = pd.DataFrame(rows)
    curve = report.out_of_sample_retention(table)
    assert set(curve.train_decrease) == {1e-5, 1e-3}
    verdict = report.out_of_sample_verdict(curve)["f"]
    assert verdict["label"] == "contradicted" and verdict["row"]["train_decrease"] == 1e-5
    assert verdict["row"]["from_g"] == pytest.approx(0.5)
    kept = report.out_of_sample_verdict(report.out_of_sample_retention(
        table.assign(eval_observed=table.observed)))["f"]
    assert kept["label"] == "reproduced"
    broken = report.out_of_sample_verdict(report.out_of_sample_retention(table[table.train_decrease == 1e-3]))["f"]
    assert broken["label"] == "not estimable" and "curvature" in broken["reason"]
    text = report.describe_out_of_sample(curve)
    assert "Taylor's theorem" in text and "**contradicted**" in text
    # a fraction of an optimizer step is one step whatever δ it came to in each draw
    fractions = table[table.train_decrease == 1e-5].assign(step_fraction=0.1,
                                                           train_decrease=lambda f: 1e-5 * (1 + f.index % 3))
    assert len(report.out_of_sample_retention(fractions)) == 1


def test_the_out_of_sample_retention_rule_is_simulated_at_the_committed_design():
    """At the committed cpu design (each family's models and the draws the verdict reads: the retention study's
    float64 steps on E where it measured them, at the judged δ, predicting a decrease): when ΔL_E keeps the whole
    prediction from g_K (draws off by ±0.05, models by ±0.05) "reproduced" comes out most of the time; when it keeps
    half or none of it, never. With draws as noisy as ±0.3 the rule rarely reproduces: at this design it can
    contradict, not confirm, a retention near 1."""
    from dalign_repro.config import REPO_ROOT

    table, provenance = read_table(REPO_ROOT / "results" / "cpu", "interventions")
    steps = report.out_of_sample_steps(table)
    verdicts = report.out_of_sample_verdict(report.out_of_sample_retention(table))
    source = "retention" if (steps.study == "retention").any() else "sign"
    for family, part in steps[(steps.study == source) & (steps.setting == "train/heldout")
                              & steps.step_fraction.isna()].groupby("family"):
        delta = verdicts[family].get("row", {}).get("train_decrease", provenance["config"]["sign_step"])
        draws = part[np.isclose(part.train_decrease, delta)].groupby("model").size().tolist()
        assert len(draws) >= 4 and sum(draws) >= 30, (family, draws)
        effect = report.simulate_out_of_sample_verdict(draws, 1.0, draw_sd=0.05, trials=40)
        assert effect.get("reproduced", 0) >= 0.8, (family, effect)
        for retention in (0.5, 0.0):
            found = report.simulate_out_of_sample_verdict(draws, retention, draw_sd=0.05, trials=20)
            assert found.get("reproduced", 0) == 0 and found.get("contradicted", 0) >= 0.95, (family, found)
        noisy = report.simulate_out_of_sample_verdict(draws, 1.0, draw_sd=0.3, trials=20)
        assert noisy.get("reproduced", 0) <= 0.5, (family, noisy)


def _judged_draws(draw_sd: float, kept: float = 1.0, models: int = 4, per_model: int = 15, seed: int = 0
                  ) -> pd.DataFrame:
    """A retention study measured on E at one small δ, first order holding on K, ΔL_E keeping ``kept`` ± ``draw_sd``
    of the prediction."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(models):
        predicted = -rng.uniform(1e-6, 2e-6, per_model)
        rows.append(pd.DataFrame(dict(study="retention", family="a", model=f"m{m}", seed=0, setting="train/heldout",
                                      kind="bias", optimizer_steps=0, train_decrease=1e-5, predicted=predicted,
                                      observed=predicted,
                                      eval_observed=predicted * rng.normal(kept, draw_sd, per_model),
                                      eval_tie=False)))
    return pd.concat(rows, ignore_index=True)


def _curve(table: pd.DataFrame) -> pd.DataFrame:
    return report.out_of_sample_retention(table)


def _verdicts(table: pd.DataFrame) -> dict:
    return report.out_of_sample_verdict(_curve(table))


def test_the_out_of_sample_rule_states_what_it_can_tell_at_the_measured_noise():
    """The design read from the table (draws per model, spread between draws) and the simulated power: a quiet
    table can confirm a retention of 1, a noisy one cannot, and the sentence says which."""
    quiet, noisy = _judged_draws(0.03), _judged_draws(0.8)
    design = report.out_of_sample_design(quiet, _verdicts(quiet))["a"]
    assert design["draws"] == [15] * 4 and 0.015 < design["draw_sd"] < 0.05
    assert 0.5 < report.out_of_sample_design(noisy, _verdicts(noisy))["a"]["draw_sd"] < 1.2
    said = report.describe_out_of_sample_calibration(quiet, _curve(quiet), trials=20)
    power = float(said.split("*reproduced* in ")[1].split("%")[0])
    assert power >= 80 and "too small" not in said
    said = report.describe_out_of_sample_calibration(noisy, _curve(noisy), trials=20)
    assert float(said.split("*reproduced* in ")[1].split("%")[0]) <= 20 and "the design is too small" in said
    assert "not simulated" in report.describe_out_of_sample_calibration(quiet.iloc[0:0], _curve(quiet.iloc[0:0]))
    off = _judged_draws(0.03, kept=0.0)  # contradicted, and a true 100% is never read so at this noise
    assert _verdicts(off)["a"]["label"] == "contradicted"
    assert "so the *contradicted* here stands" in report.describe_out_of_sample_calibration(off, _curve(off), trials=20)
