"""The shared width sweep, driven by a toy family (a residual MLP on synthetic classes) added in a few dozen lines."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from dalign_repro.report import describe as report
from dalign_repro.sweep import measure
from dalign_repro.sweep import rates as rate_fit
from dalign_repro.sweep import run as sweep
from dalign_repro.sweep.plan import check_jobs, job_grid, jobs_dir, trainings
from dalign_repro.sweep.pools import draw_pools
from dalign_repro.sweep.projection import dry_run
from dalign_repro.sweep.rates import _extended, lr_check
from dalign_repro.sweep.trained import checkpoint_root
from dalign_repro.data.supply import DataSupplyError
from dalign_repro.sweep.family import Family, Splits, SweepConfig, take

# ----------------------------------------------------------------------------- the toy family


class ResidualMLP(nn.Module):
    def __init__(self, width: int, inputs: int = 8, classes: int = 3, depth: int = 2):
        super().__init__()
        self.embed = nn.Linear(inputs, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                    for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        z = self.embed(x)
        for block in self.blocks:
            z = z + block(z)
        return self.head(z)


@dataclass(frozen=True)
class ToyConfig(SweepConfig):
    widths: tuple[int, ...] = (8, 16, 32)
    seeds: int = 2
    steps: int = 30
    batch_size: int = 32
    warmup_steps: int = 3
    lr_candidates: tuple[float, ...] = (3e-3, 3e-2)
    checkpoint_steps: tuple[int, ...] = (0, 20, 30)
    pool_size: int = 64
    eval_examples: int = 64
    validation_examples: int = 64
    capture_batch: int = 32
    budgets: tuple[tuple[int, int], ...] = ((4, 4), (8, 8))
    resamples: int = 500
    device: str = "cpu"
    beatable: bool = True


def _classes(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, :3] + 0.3 * torch.randn(n, 3, generator=g)).argmax(dim=1)


class ToyFamily(Family):
    name = "toy"
    training_fields = ("beatable",)

    def load_data(self, config):
        return Splits(train=_classes(512, 0), validation=_classes(128, 1), test=_classes(256, 2), unit="points",
                      summary={"source": "synthetic"})

    def build(self, config, width, seed, splits):
        torch.manual_seed(seed)
        return ResidualMLP(width)

    def insertion_points(self, config, model):
        return ["blocks.0", "blocks.1"]

    def primary_layer(self, config):
        return "blocks.0"

    def batches(self, examples, batch_size):
        x, y = examples
        return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]

    def train_loss(self, model, batch):
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    @torch.no_grad()
    def heldout_metric(self, model, examples, config):
        return float(nn.functional.cross_entropy(model(examples[0]), examples[1]))

    def baseline(self, splits, examples, config):
        return math.log(3) if config.beatable else 0.0  # 0 nats: no model can beat it


# ----------------------------------------------------------------------------- tests


@pytest.fixture
def checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    return tmp_path / "checkpoints"


@pytest.fixture
def toy_tables(checkpoints):
    return sweep.run_sweep(ToyConfig(), ToyFamily())


def test_a_toy_family_runs_through_every_shared_step(toy_tables):
    tables, extra = toy_tables
    config = ToyConfig()
    assert set(tables) == set(sweep.tables_of(ToyFamily()))
    lr, runs, geometry = tables["toy_lr"], tables["toy_runs"], tables["toy_geometry"]
    # every candidate rate tried once per width at the first seed, exactly one kept; a width whose best rate
    # sat at an edge of its grid tried rates past it, so the kept rate is inside the grid or extensions ran out
    assert all(set(config.lr_grid(w)) <= set(lr[lr.width == w].lr) for w in config.widths)
    assert len(lr) >= len(config.widths) * len(config.lr_candidates) and not lr.check.any()
    assert (lr.groupby("width").chosen.sum() == 1).all()
    for width, rates in lr.groupby("width"):
        extra_rates = len(rates) - len(config.lr_candidates)
        best = rates[rates.chosen].lr.iloc[0]
        assert extra_rates == config.lr_extend or rates.lr.min() < best < rates.lr.max(), rates
    kept = lr[lr.chosen].set_index("width").lr
    assert (runs.set_index(["width", "seed"]).lr == runs.width.map(kept).values).all()
    assert runs.trained_ok.all() and len(runs) == len(config.widths) * config.seeds
    # one geometry row per (run, checkpoint, pool, layer)
    assert len(geometry) == len(runs) * len(config.checkpoint_steps) * 2 * 2
    assert (geometry.n == config.pool_size).all() and set(geometry.d) == set(config.widths)
    assert geometry.groupby(["width", "seed", "step"]).heldout_loss.nunique().eq(1).all()
    # bounds only in the theorem's setting
    misalignment = tables["toy_misalignment"]
    same = misalignment[misalignment.setting == "heldout/heldout"]
    transfer = misalignment[misalignment.setting == "train/heldout"]
    assert same.b_exact.notna().all() and (same.b_exact <= same.b_align + 1e-12).all()
    assert transfer[["b_exact", "b_align", "b_align_at_lo"]].isna().all().all() and (transfer.bound_note != "").all()
    assert (misalignment.p_misalign_lo <= misalignment.p_misalign).all()
    assert (misalignment.p_misalign <= misalignment.p_misalign_hi).all()
    # out of sample: the held-out pool's certificates beside a p̂ resampled from the disjoint evaluation examples
    fresh = misalignment[misalignment.setting == "evaluation/evaluation"]
    assert len(fresh) == len(same) and (fresh.estimate_pool == "heldout").all()
    assert (fresh.resample_pool == "evaluation").all() and (same.resample_pool == "heldout").all()
    keys = ["width", "seed", "M", "K"]
    pd.testing.assert_frame_equal(fresh[keys + ["b_exact", "b_align"]].reset_index(drop=True),
                                  same[keys + ["b_exact", "b_align"]].reset_index(drop=True))
    assert not np.allclose(fresh.p_misalign.to_numpy(), same.p_misalign.to_numpy())
    # slope tests: the late window of three quantities and every checkpoint per (layer, pool), matched loss
    # at the primary layer, every budget; three rows are the judged ones
    trend = tables["toy_trend"]
    assert len(trend[trend.view == "late_window"]) == 3 * 2 * 2
    assert len(trend[trend.view == "step"]) == 2 * 2 * len(config.checkpoint_steps)
    assert set(trend[trend.view == "matched_loss"].layer) == {"blocks.0"}
    assert len(trend[trend.view == "budget"]) == 2 * len(config.budgets)
    fitted = trend[trend.label != "not run"]  # d_par can be +inf at every run: nothing to fit
    assert (fitted.slope_lo <= fitted.slope).all() and (fitted.slope <= fitted.slope_hi).all()
    assert set(fitted.label) <= {"reproduced", "contradicted", "inconclusive"} and (fitted.detectable >= 0).all()
    judged = trend[trend.judged]
    assert sorted(judged.view) == ["budget", "late_window", "matched_loss"]
    assert (judged.n_runs == len(runs)).all() and judged.layer.eq("blocks.0").all()
    assert tuple(judged[judged.view == "budget"][["M", "K"]].iloc[0]) == config.budget_judged
    assert extra["pools"] == {"train": 64, "heldout": 64, "evaluation": 64, "validation": 64}


def test_the_sweep_is_deterministic(toy_tables, checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "fresh"))  # train again from scratch
    again, _ = sweep.run_sweep(ToyConfig(), ToyFamily())
    for name, table in toy_tables[0].items():
        pd.testing.assert_frame_equal(table.drop(columns=["seconds"], errors="ignore"),
                                      again[name].drop(columns=["seconds"], errors="ignore"), check_exact=True)


def test_checkpoints_before_the_last_capture_a_subsample_of_each_pool(toy_tables):
    """checkpoint_pool_size changes what the checkpoints before the last measure, and nothing else: the models (loaded
    from the same checkpoints), the final checkpoint's rows, the misalignment study and the runs are the same."""
    full, _ = toy_tables
    config = ToyConfig(checkpoint_pool_size=16)
    assert config.models_hash() == ToyConfig().models_hash() != config.config_hash()
    tables, _ = sweep.run_sweep(config, ToyFamily())
    geometry, whole = tables["toy_geometry"], full["toy_geometry"]
    final = geometry.step == config.steps
    assert (geometry[final].n == config.pool_size).all() and (geometry[~final].n == 16).all()
    pd.testing.assert_frame_equal(geometry[final].reset_index(drop=True),
                                  whole[whole.step == config.steps].reset_index(drop=True), check_exact=True)
    assert not np.allclose(geometry[~final].mean_sq.to_numpy(), whole[whole.step != config.steps].mean_sq.to_numpy())
    # the held-out loss is the evaluation set's at every checkpoint, whatever the pool captured
    pd.testing.assert_series_equal(geometry.heldout_loss, whole.heldout_loss, check_exact=True)
    for name in ("toy_misalignment", "toy_redundancy", "toy_lr"):
        pd.testing.assert_frame_equal(tables[name], full[name], check_exact=True)
    loaded = ["seconds", "training_loaded"]  # the second sweep loads every model the first one trained
    assert tables["toy_runs"].training_loaded.all()
    pd.testing.assert_frame_equal(tables["toy_runs"].drop(columns=loaded), full["toy_runs"].drop(columns=loaded))
    # each checkpoint before the last takes the next block of the pool's random order; the last, the whole pool
    pools = draw_pools(config, ToyFamily().load_data(config))
    assert torch.equal(measure.checkpoint_pool(config, pools.heldout, 0), pools.heldout[:16])
    assert torch.equal(measure.checkpoint_pool(config, pools.heldout, 20), pools.heldout[16:32])
    assert torch.equal(measure.checkpoint_pool(config, pools.heldout, config.steps), pools.heldout)
    wrapped = ToyConfig(checkpoint_pool_size=48, checkpoint_steps=(0, 10, 20, 30))
    assert torch.equal(measure.checkpoint_pool(wrapped, pools.heldout, 10), pools.heldout[torch.arange(48, 96) % 64])
    text = dry_run(config, ToyFamily())
    assert "3 pool captures (3 at every insertion point, 0 at the primary one" in text  # 2 pools x (1/4 + 1/4 + 1)
    assert "checkpoints before the last capture 16 of them" in text


@pytest.mark.parametrize("size", [0, 1])
def test_a_checkpoint_pool_too_small_to_estimate_from_is_refused(size):
    with pytest.raises(ValueError, match=f"checkpoint_pool_size {size} must be at least 2"):
        ToyConfig(checkpoint_pool_size=size)


def test_a_checkpoint_pool_as_large_as_the_pool_is_the_whole_pool():
    config, pools = ToyConfig(checkpoint_pool_size=65), torch.arange(64)  # e.g. after an override of pool_size
    assert torch.equal(measure.checkpoint_pool(config, pools, 0), pools)


def test_failed_runs_are_reported_and_left_out_of_trends(checkpoints):
    tables, _ = sweep.run_sweep(ToyConfig(beatable=False, widths=(8, 16, 24), seeds=1), ToyFamily())
    assert not tables["toy_runs"].trained_ok.any()
    assert (tables["toy_runs"].failure.str.contains("does not beat the baseline")).all()
    assert not tables["toy_geometry"].trained_ok.any() and len(tables["toy_geometry"]) > 0
    assert tables["toy_trend"].empty


def test_a_diverging_rate_is_recorded_and_never_chosen(checkpoints):
    tables, _ = sweep.run_sweep(ToyConfig(lr_candidates=(3e-2, 1e30), widths=(8, 16, 24), seeds=1), ToyFamily())
    lr = tables["toy_lr"]
    assert lr[lr.lr == 1e30].diverged.all() and not lr[lr.lr == 1e30].chosen.any()
    assert math.isinf(lr[lr.lr == 1e30].validation_loss.iloc[0])
    assert (tables["toy_runs"].lr == 3e-2).all()


def test_a_pool_the_data_cannot_supply_fails_before_training(checkpoints):
    with pytest.raises(DataSupplyError, match=r"held-out split has 256 .*pool_size \+ eval_examples = 200 \+ 64"):
        sweep.run_sweep(ToyConfig(pool_size=200), ToyFamily())
    with pytest.raises(ValueError, match=r"M \+ K > pool_size / 4 = 16"):
        sweep.run_sweep(ToyConfig(budgets=((8, 16),)), ToyFamily())
    assert not checkpoints.exists()


def test_pools_are_random_disjoint_and_shared():
    config, splits = ToyConfig(), ToyFamily().load_data(ToyConfig())
    pools = draw_pools(config, splits)
    again = draw_pools(config, splits)
    assert all(torch.equal(getattr(pools, f), getattr(again, f)) for f in ("train", "heldout", "evaluation", "validation"))
    assert not set(pools.heldout.tolist()) & set(pools.evaluation.tolist())
    assert not torch.equal(pools.heldout, torch.arange(config.pool_size))  # not the first rows
    other = draw_pools(ToyConfig(seed=1), splits)
    assert not torch.equal(pools.heldout, other.heldout)
    assert take(splits.test, pools.heldout)[0].shape == (config.pool_size, 8)


def test_dry_run_projects_the_full_run(checkpoints):
    text = dry_run(ToyConfig(), ToyFamily())
    assert "rate fit (each_width): 2 trials of 30 steps at every width (grid extensions not counted)" in text
    assert text.count("ms/step x 30 steps x 3 =") == 3 and "projected:" in text  # 2 trials, the second seed
    assert "on 8 such devices sharing the jobs (torchrun --nproc_per_node=8" in text
    assert not checkpoints.exists()


def test_dry_run_projects_this_machines_workers(checkpoints, monkeypatch):
    from dalign_repro.training import workers

    monkeypatch.setattr(workers, "count", lambda: 2)
    text = dry_run(ToyConfig(), ToyFamily())
    serial = float(text.split("projected: ")[1].split(" s")[0])
    shared = float(text.split("one-thread workers (the default; DALIGN_WORKERS): ")[1].split(" s")[0])
    # two workers share the jobs: at best half the time (the figures are printed to 4 significant digits)
    assert serial / 2 * (1 - 1e-3) <= shared < serial
    monkeypatch.setattr(workers, "count", lambda: 1)
    assert "one-thread workers" not in dry_run(ToyConfig(), ToyFamily())


def test_a_dry_run_also_projects_other_numbers_of_seeds_from_the_same_timings(checkpoints, monkeypatch):
    """``also_seeds``: the projection of the same sweep at n seeds, as a dry run of that config gives it on the same
    timings (fixed here, so that the two dry runs can be compared)."""
    from dalign_repro.sweep import projection
    from dalign_repro.training import workers

    monkeypatch.setattr(workers, "count", lambda: 2)
    monkeypatch.setattr(projection, "_time_width", lambda config, family, splits, heldout, evaluation, width, steps,
                        device: {"step": 1e-3 * width, "capture_every": 0.5, "capture_primary": 0.25,
                                 "evaluation": 0.125, "redundancy": 2.0})
    text = dry_run(ToyConfig(), ToyFamily(), also_seeds=(1, 5))
    for seeds in (1, 5):
        alone = dry_run(replace(ToyConfig(), seeds=seeds), ToyFamily())
        serial = alone.split("projected: ")[1].split(" s")[0]
        shared = alone.split("one-thread workers (the default; DALIGN_WORKERS): ")[1].split(" s")[0]
        assert (f"at {seeds} seeds, the same timings: {serial} s" in text
                and f", {shared} s (" in text.split(f"at {seeds} seeds")[1].splitlines()[0]), (seeds, alone, text)
    assert "at 5 seeds" not in dry_run(ToyConfig(), ToyFamily())


def test_a_transfer_dry_run_counts_the_narrowest_trials_and_the_widest_check(checkpoints):
    config = ToyConfig(lr_fit="transfer", lr_width_exponent=1.0)
    assert trainings(config) == {8: 3.0, 16: 2.0, 32: 3.0}  # 2 trials + 2 seeds; 2 seeds; seed 1 + 2 checks
    assert trainings(replace(config, lr_trial_fraction=0.5)) == {8: 3.0, 16: 2.0, 32: 3.0}
    assert trainings(ToyConfig(lr_trial_fraction=0.5)) == {8: 3.0, 16: 3.0, 32: 4.0}
    text = dry_run(config, ToyFamily())
    assert "rate fit (transfer): 2 trials of 30 steps at N=8, then 2 trainings at N=32 for the full-length check" in text
    assert [line.split(" = ")[0].split(" x ")[-1] for line in text.splitlines() if "ms/step" in line] == ["3", "2", "3"]


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_the_job_grid_costs_a_reused_training_as_a_measurement(fraction):
    """The first seed's run loads its training where a full-length trial (or, with short trials, the widest width's
    check) made it: its job costs a measurement on one rank, every other run a training and a measurement."""
    config = ToyConfig(lr_trial_fraction=fraction)
    training, measuring = {8: 10.0, 16: 20.0, 32: 40.0}, {8: 1.0, 16: 2.0, 32: 4.0}
    trials, runs = job_grid(config, {w: 1 for w in config.widths}, training, measuring)
    assert [job.cost for job in trials] == [training[w] * fraction for w in config.widths for _ in range(2)]
    reused = {(w, 0) for w in config.widths} if fraction == 1.0 else {(32, 0)}
    assert {job.payload: job.cost for job in runs} == {
        (w, s): measuring[w] + (0.0 if (w, s) in reused else training[w]) for w in config.widths for s in (0, 1)}
    checks = check_jobs(config, {w: 1 for w in config.widths}, training, [3e-3, 3e-2])
    assert [(job.name, job.cost) for job in checks] == [("full_N32_lr0.003", 40.0), ("full_N32_lr0.03", 40.0)]


def test_pruning_keeps_only_the_chosen_rates_checkpoints(checkpoints):
    config = ToyConfig(widths=(8, 16, 24), seeds=1, prune_candidates=True)
    tables, _ = sweep.run_sweep(config, ToyFamily())
    kept = sorted(p.name for p in checkpoint_root(config, ToyFamily()).iterdir())
    chosen = tables["toy_lr"][tables["toy_lr"].chosen]
    assert kept == sorted(f"N{r.width}_seed0_lr{r.lr:g}" for r in chosen.itertuples())


def test_an_interrupted_sweep_resumes_job_by_job_to_the_same_tables(checkpoints, tmp_path, monkeypatch):
    config = ToyConfig(widths=(8, 16, 24), seeds=2)
    uninterrupted, _ = sweep.run_sweep(config, ToyFamily())
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "second"))
    jobs = jobs_dir(tmp_path / "results", config, ToyFamily())
    real_measured_run, calls = sweep._measured_run, []

    def dies_at_width_24(config, family, splits, pools, width, seed, *args):
        if width == 24:
            raise KeyboardInterrupt("the machine went away")
        calls.append((width, seed))
        return real_measured_run(config, family, splits, pools, width, seed, *args)

    monkeypatch.setattr(sweep, "_measured_run", dies_at_width_24)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(config, ToyFamily(), jobs=jobs)
    trials = [f"lr_N{r.width}_lr{r.lr:g}.json" for r in uninterrupted["toy_lr"].itertuples()]  # grids grown too
    assert sorted(p.name for p in jobs.iterdir()) == sorted(
        trials + ["N8_seed0.json", "N8_seed1.json", "N16_seed0.json", "N16_seed1.json"])
    monkeypatch.setattr(sweep, "_measured_run", real_measured_run)
    monkeypatch.setattr(rate_fit, "_rate_trial", lambda *a: pytest.fail("a finished rate trial ran again"))
    resumed, _ = sweep.run_sweep(config, ToyFamily(), jobs=jobs)
    assert not jobs.exists()  # removed once the tables are built
    for name, table in uninterrupted.items():
        pd.testing.assert_frame_equal(table.drop(columns=["seconds"], errors="ignore"),
                                      resumed[name].drop(columns=["seconds"], errors="ignore"), check_exact=True)


def test_a_gpu_profile_is_refused_on_a_cpu_unless_asked_for(checkpoints, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="profile 'gpu' trains models sized for a GPU.*scripts/gpu_run.sh"):
        sweep.run_sweep(ToyConfig(profile="gpu", device="auto"), ToyFamily())
    assert not checkpoints.exists()
    tables, _ = sweep.run_sweep(ToyConfig(profile="gpu", device="cpu", widths=(8, 16, 24), seeds=1), ToyFamily())
    assert len(tables["toy_runs"]) == 3


def test_the_rate_grid_moves_with_width():
    config = ToyConfig(widths=(32, 64, 256), lr_candidates=(3e-3, 1e-2, 3e-2), lr_width_exponent=1.0)
    assert config.lr_grid(32) == (3e-3, 1e-2, 3e-2)
    assert config.lr_grid(64) == (1.5e-3, 5e-3, 1.5e-2)
    assert config.lr_grid(256) == (3.75e-4, 1.25e-3, 3.75e-3)
    assert ToyConfig().lr_grid(32) == ToyConfig().lr_grid(8) == (3e-3, 3e-2)  # exponent 0: one grid for all


def test_short_rate_trials_are_checked_at_full_length_at_the_widest_width(checkpoints):
    config = ToyConfig(widths=(8, 16, 24), seeds=2, lr_trial_fraction=0.5, lr_extend=0)
    tables, extra = sweep.run_sweep(config, ToyFamily())
    lr = tables["toy_lr"]
    trials, checks = lr[~lr.check], lr[lr.check]
    assert (trials.steps == 15).all() and len(trials) == 3 * 2
    # the check trains the short fit's best two rates at the widest width for all 30 steps
    assert set(checks.width) == {24} and (checks.steps == 30).all() and len(checks) == 2
    assert set(checks.lr) == set(trials[trials.width == 24].lr) and checks.chosen.sum() == 1
    summary = lr_check(lr)
    assert summary["width"] == 24 and summary["passed"] == (summary["short_choice"] == summary["full_choice"])
    assert extra["lr_check"] == summary
    # the measured runs use the short fit's choice; trials left no analysis checkpoints beyond their last step
    kept = trials[trials.chosen].set_index("width").lr
    assert (tables["toy_runs"].lr.values == tables["toy_runs"].width.map(kept).values).all()
    trial_dirs = [p for p in checkpoint_root(config, ToyFamily()).iterdir() if "_trial15" in p.name]
    assert len(trial_dirs) == 6 and all(sorted(q.name for q in d.iterdir())[-1] == "step_0000015" for d in trial_dirs)


def _scripted_rates(monkeypatch, best):
    """Rate trials that train nothing and score ``(log lr - log best(width))^2`` nats: a fit whose answer is known."""
    def scored(config, family, splits, pools, width, lr, device, group=None, trial=True):
        steps = config.trial_steps if trial else config.steps
        return dict(family=family.name, width=width, seed=config.seed, lr=lr, steps=steps,
                    validation_loss=math.log(lr / best(width)) ** 2, diverged=False, failure="")
    monkeypatch.setattr(rate_fit, "_rate_trial", scored)


TRANSFER = ToyConfig(widths=(8, 16, 24), seeds=1, lr_fit="transfer", lr_width_exponent=1.0,
                     lr_candidates=(3e-3, 1e-2, 3e-2))


def test_a_transfer_fits_the_narrowest_width_and_checks_the_carried_rate_at_the_widest(checkpoints, monkeypatch,
                                                                                        tmp_path):
    _scripted_rates(monkeypatch, best=lambda width: 1e-2 * 8 / width)  # the 1/N rule holds
    tables, extra = sweep.run_sweep(TRANSFER, ToyFamily())
    lr, runs = tables["toy_lr"], tables["toy_runs"]
    trials, checks = lr[~lr.check], lr[lr.check]
    assert set(trials.width) == {8} and trials[trials.chosen].lr.tolist() == [1e-2]
    # carried as 8/N; the check trains it at N = 24 beside the neighbour on the runner-up's side (3e-2 at N = 8)
    assert set(checks.width) == {24} and (checks.steps == 30).all()
    assert dict(zip(checks.lr, checks.carried)) == {0.00333: True, 0.01: False}
    assert runs.set_index("width").lr.to_dict() == {8: 0.01, 16: 0.005, 24: 0.00333}
    summary = lr_check(lr)
    assert summary == extra["lr_check"] and summary["method"] == "transfer" and summary["passed"]
    assert (summary["fitted_width"], summary["fitted"], summary["carried"], summary["neighbour"]) == (
        8, 0.01, 0.00333, 0.01)
    lr.to_csv(tmp_path / "lr.csv", index=False)  # the carried column is empty on the trials' rows
    assert lr_check(pd.read_csv(tmp_path / "lr.csv")) == summary


def test_a_failed_transfer_fits_every_width_and_keeps_its_check(checkpoints, monkeypatch):
    _scripted_rates(monkeypatch, best=lambda width: 1e-2)  # one rate suits every width: the 1/N rule fails
    tables, extra = sweep.run_sweep(TRANSFER, ToyFamily())
    lr, runs = tables["toy_lr"], tables["toy_runs"]
    trials, checks = lr[~lr.check], lr[lr.check]
    assert set(trials.width) == {8, 16, 24}
    assert checks[checks.chosen].lr.tolist() == [0.01] and checks[checks.chosen].carried.tolist() == [False]
    # every width's own grid (16 and 24 grown past their top edge) keeps the rate nearest 1e-2
    assert runs.set_index("width").lr.to_dict() == {8: 0.01, 16: 0.015, 24: 0.01}
    summary = lr_check(lr)
    assert summary["method"] == "transfer" and not summary["passed"] and summary["fallback"] == {}
    assert "lost to its neighbour" in report.describe_learning_rates(lr, runs)


def test_a_transfer_of_one_rate_or_to_one_width_is_no_transfer():
    assert trainings(ToyConfig(lr_fit="transfer", lr_candidates=(1e-2,))) == trainings(
        ToyConfig(lr_candidates=(1e-2,)))
    assert not ToyConfig(lr_fit="transfer", widths=(8,)).full_check
    with pytest.raises(ValueError, match="is not one of"):
        ToyConfig(lr_fit="muP")


def test_a_best_rate_at_the_grid_edge_grows_the_grid(checkpoints):
    # 3e-5 and 1e-4 both train too slowly in 30 steps: the best is the top rate, so the grid grows upwards
    config = ToyConfig(widths=(8, 16, 24), seeds=1, lr_candidates=(3e-5, 1e-4), lr_extend=1)
    lr = sweep.run_sweep(config, ToyFamily())[0]["toy_lr"]
    for width, rates in lr.groupby("width"):
        grid = config.lr_grid(width)
        assert len(rates) == 3 and rates.lr.max() == pytest.approx(grid[1] * grid[1] / grid[0], rel=1e-2)


def test_extension_stops_inside_the_grid():
    assert _extended((1e-3, 3e-3, 1e-2), 3e-3) is None
    assert _extended((1e-3, 3e-3, 1e-2), 1e-2) == (1e-3, 3e-3, 1e-2, 0.0333)
    assert _extended((1e-3, 3e-3), 1e-3) == (3.33e-4, 1e-3, 3e-3)
    assert _extended((1e-3,), 1e-3) is None


def test_each_regimes_jobs_stay_until_the_last_regime_is_done(checkpoints, tmp_path, monkeypatch):
    """An interruption in the second regime keeps the first regime's finished jobs (they resume, not rerun)."""
    first, second = ToyConfig(widths=(8, 16), seeds=1), ToyConfig(widths=(8, 16), seeds=1, seed=1)
    out = tmp_path / "results"
    real_run_sweep, seen = sweep.run_sweep, []

    def stops_in_the_second(config, family, jobs=None, ranks_per_job=None, keep_jobs=False):
        if config == second:
            seen.append(sorted(p.name for p in jobs_dir(out, first, family).iterdir()))
            raise KeyboardInterrupt("the machine went away")
        return real_run_sweep(config, family, jobs, ranks_per_job, keep_jobs)

    monkeypatch.setattr(sweep, "run_sweep", stops_in_the_second)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweeps([first, second], ToyFamily(), out)
    assert seen and any(name.startswith("N8_seed0") for name in seen[0])  # the first regime's runs are kept
    monkeypatch.setattr(sweep, "run_sweep", real_run_sweep)
    sweep.run_sweeps([first, second], ToyFamily(), out)
    assert not (out / "partial").exists()  # every regime's jobs removed once all are done
