"""The shared width sweep, driven by a toy family (a residual MLP on synthetic classes) added in a few dozen lines."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import pytest
import torch
from torch import nn

from dalign_core import sweep
from dalign_core.data.supply import DataSupplyError
from dalign_core.family import Family, Splits, SweepConfig, take

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
    trend_resamples: int = 100
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
    # every candidate rate tried once per width at the first seed, exactly one kept
    assert len(lr) == len(config.widths) * len(config.lr_candidates)
    assert all(set(lr[lr.width == w].lr) == set(config.lr_grid(w)) for w in config.widths)
    assert (lr.groupby("width").chosen.sum() == 1).all()
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
    # trends: one per (layer, pool, step), per matched-loss level, per budget
    trend = tables["toy_trend"]
    assert len(trend[trend.view == "matched_step"]) == 2 * 2 * len(config.checkpoint_steps)
    assert set(trend[trend.view == "matched_step"].step[trend.last_third.astype(bool)]) == {20, 30}
    assert len(trend[trend.view == "budget"]) == 2 * len(config.budgets)
    assert trend.rho.between(-1, 1).all() and (trend.rho_lo <= trend.rho_hi).all()
    assert extra["pools"] == {"train": 64, "heldout": 64, "evaluation": 64, "validation": 64}


def test_the_sweep_is_deterministic(toy_tables, checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "fresh"))  # train again from scratch
    again, _ = sweep.run_sweep(ToyConfig(), ToyFamily())
    for name, table in toy_tables[0].items():
        pd.testing.assert_frame_equal(table.drop(columns=["seconds"], errors="ignore"),
                                      again[name].drop(columns=["seconds"], errors="ignore"), check_exact=True)


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
    pools = sweep.draw_pools(config, splits)
    again = sweep.draw_pools(config, splits)
    assert all(torch.equal(getattr(pools, f), getattr(again, f)) for f in ("train", "heldout", "evaluation", "validation"))
    assert not set(pools.heldout.tolist()) & set(pools.evaluation.tolist())
    assert not torch.equal(pools.heldout, torch.arange(config.pool_size))  # not the first rows
    other = sweep.draw_pools(ToyConfig(seed=1), splits)
    assert not torch.equal(pools.heldout, other.heldout)
    assert take(splits.test, pools.heldout)[0].shape == (config.pool_size, 8)


def test_matched_loss_reads_each_run_where_it_first_reaches_a_common_level():
    rows = []
    curves = {(8, 0): [3.0, 2.0, 1.5], (16, 0): [3.0, 1.4, 1.2], (32, 0): [3.0, 1.3, 1.1]}
    for (width, seed), losses in curves.items():
        for step, loss in zip((0, 10, 20), losses):
            rows.append(dict(width=width, seed=seed, step=step, layer="a", pool="heldout", heldout_loss=loss,
                             d_align=width * 100 + step))
    matched = sweep.matched_loss_rows(pd.DataFrame(rows), offsets=(0.0, 0.6))
    base = matched[matched.loss_offset == 0.0].set_index("width")
    assert base.loss_level.unique().tolist() == [1.5]  # the worst final loss: every run reaches it
    assert base.step.to_dict() == {8: 20, 16: 10, 32: 10}
    high = matched[matched.loss_offset == 0.6].set_index("width")
    assert high.step.to_dict() == {8: 10, 16: 10, 32: 10}


def test_dry_run_projects_the_full_run(checkpoints):
    text = sweep.dry_run(ToyConfig(), ToyFamily())
    assert "3 trainings (2 rates + 1 more seeds) of 30 steps" in text
    assert text.count("ms/step x 30 steps") == 3 and "projected:" in text
    assert "on 8 such devices sharing the jobs (torchrun --nproc_per_node=8" in text
    assert not checkpoints.exists()


def test_pruning_keeps_only_the_chosen_rates_checkpoints(checkpoints):
    config = ToyConfig(widths=(8, 16, 24), seeds=1, prune_candidates=True)
    tables, _ = sweep.run_sweep(config, ToyFamily())
    kept = sorted(p.name for p in sweep.checkpoint_root(config, ToyFamily()).iterdir())
    chosen = tables["toy_lr"][tables["toy_lr"].chosen]
    assert kept == sorted(f"N{r.width}_seed0_lr{r.lr:g}" for r in chosen.itertuples())


def test_an_interrupted_sweep_resumes_job_by_job_to_the_same_tables(checkpoints, tmp_path, monkeypatch):
    config = ToyConfig(widths=(8, 16, 24), seeds=2)
    uninterrupted, _ = sweep.run_sweep(config, ToyFamily())
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "second"))
    jobs = sweep.jobs_dir(tmp_path / "results", config, ToyFamily())
    real_measured_run, calls = sweep._measured_run, []

    def dies_at_width_24(config, family, splits, pools, width, seed, *args):
        if width == 24:
            raise KeyboardInterrupt("the machine went away")
        calls.append((width, seed))
        return real_measured_run(config, family, splits, pools, width, seed, *args)

    monkeypatch.setattr(sweep, "_measured_run", dies_at_width_24)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(config, ToyFamily(), jobs=jobs)
    trials = [f"lr_N{w}_lr{lr:g}.json" for w in config.widths for lr in config.lr_grid(w)]
    assert sorted(p.name for p in jobs.iterdir()) == sorted(
        trials + ["N8_seed0.json", "N8_seed1.json", "N16_seed0.json", "N16_seed1.json"])
    monkeypatch.setattr(sweep, "_measured_run", real_measured_run)
    monkeypatch.setattr(sweep, "_rate_trial", lambda *a: pytest.fail("a finished rate trial ran again"))
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
