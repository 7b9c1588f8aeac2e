"""The width sweep: the steps every model family shares, written once.

For each width N of a :class:`~dalign_core.sweep.family.SweepConfig`, with a
:class:`~dalign_core.sweep.family.Family` answering the family-specific questions:

1. **A learning rate that fits the width.** Train the first seed at every rate of the
   width's grid (``lr_candidates``, moved with width by ``lr_width_exponent``) and keep
   the one with the lowest loss on the *validation* split (whole documents that are
   neither a q pool nor the test text). One rate for all widths would compare a
   well-tuned narrow model with a badly tuned wide one. Under ``lr_fit='transfer'``
   (μTransfer) only the narrowest width is fitted; its rate is carried to every width
   by the grid's rule and checked at full length at the widest width against its grid
   neighbour; if the neighbour wins, every width is fitted after all.
2. **Seeds.** Train the other seeds at that rate (the first seed's run is reused).
3. **Geometry along training.** At every analysis checkpoint: the held-out loss on
   ``eval_examples`` test examples, and q at every insertion point on two pools drawn
   at random without replacement — ``pool_size`` training examples and ``pool_size``
   test examples disjoint from the evaluation ones — estimated with the unbiased Gram
   U-statistics (``<family>_geometry``).
4. **Misalignment** at the final checkpoint and the family's primary insertion point:
   ``Pr(mu_M^T g_K <= 0)`` from resamples, with a Wilson interval, for budgets with
   ``M + K <= pool_size / 4`` (``<family>_misalignment``). ``heldout/heldout`` draws
   disjoint train and test subsets of the held-out pool: both means come from one law,
   the theorem's setting, so ``B_exact`` and ``B_align`` sit beside it.
   ``train/heldout`` draws M from the train pool: the question a growth method faces,
   which the theorem does not cover (the laws differ), so its bound columns are empty.
5. **Trends** (``<family>_trend``): Spearman's ρ of width against d_align with a seed
   bootstrap (:mod:`dalign_core.sweep.trend`) at every checkpoint ("matched steps"), at
   matched held-out loss (each run at the first checkpoint where it reaches a common
   loss level), and of width against the misalignment probability per budget.

A run that diverges, or whose final held-out loss does not beat the family's
baseline, is marked ``trained_ok = False``: reported as failed, never part of a trend.
Before anything trains, the data is checked to supply every pool, and a run of many
epochs over its split warns (the epoch count goes into the provenance).

The work is a grid of independent jobs — each (width, rate) trial of step 1, then each
measured (width, seed) run of steps 2-4 — kept one file each in a jobs folder as they
finish (:func:`jobs_dir`), so a rerun computes only what is missing. Under ``torchrun``
the ranks share that grid (:mod:`dalign_core.training.distributed`): the trials first; then every
rank reads the chosen rates from the shared folder and the measured runs follow; rank 0
merges the tables. The widest widths may train on several ranks at once (data parallel,
``DALIGN_RANKS_PER_JOB``). A plain process is a world of one and runs the same grid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from dalign_core.training import distributed
from dalign_core.training import workers
from dalign_core._tensor import derived_seed
from dalign_core.training.device import resolve_device
from dalign_core.config import REPO_ROOT
from dalign_core.data.supply import check_epochs, require_sequences, training_epochs
from dalign_core.sweep.family import Family, Splits, SweepConfig, count, take
from dalign_core.capture.hooks import accumulate_geometry
from dalign_core.sweep.measure import _measure, _misalignment, _redundancy, checkpoint_pool
from dalign_core.training.loop import TrainConfig, train
from dalign_core.sweep import trend

__all__ = ["Pools", "SWEEP_TABLES", "tables_of", "check_supply", "draw_pools", "checkpoint_root", "jobs_dir", "prepare", "trained_model", "run_sweep",
           "run_sweeps", "lr_check",
           "trend_table", "trained_only", "dry_run"]

log = logging.getLogger(__name__)

SWEEP_TABLES = ("lr", "runs", "geometry", "misalignment", "redundancy", "trend")
"""Tables every sweep writes, as ``<family>_<name>.csv``."""

GPU_PROFILES = ("gpu", "paper")
"""Profiles whose models are sized for a GPU: a sweep refuses to start them on a CPU unless asked explicitly."""


def tables_of(family: Family) -> tuple[str, ...]:
    """The result table names a family's sweep writes: ``("llama_lr", "llama_runs", ...)``."""
    return tuple(f"{family.name}_{name}" for name in SWEEP_TABLES + family.extra_tables)


@dataclass(frozen=True)
class Pools:
    """Example indices, drawn once per sweep and shared by every width and seed (a paired comparison)."""

    train: torch.Tensor
    """Train-pool indices into the train split."""
    heldout: torch.Tensor
    """Held-out-pool indices into the test split."""
    evaluation: torch.Tensor
    """Indices into the test split for the held-out loss, disjoint from ``heldout``."""
    validation: torch.Tensor
    """Indices into the validation split for choosing the learning rate."""


def check_supply(config: SweepConfig, splits: Splits) -> dict[str, Any]:
    """Refuse, before anything trains, a config the data cannot supply; return the facts for the provenance.

    Raises :class:`~dalign_core.data.supply.DataSupplyError` with the numbers, and warns
    (``RepeatedDataWarning``) when training passes over its split more than ``max_epochs`` times.
    """
    unit_length = _unit_length(splits)
    require_sequences("train", count(splits.train), config.pool_size, seq_len=unit_length,
                      field=f"pool_size={config.pool_size}")
    require_sequences("held-out", count(splits.test), config.pool_size + config.eval_examples, seq_len=unit_length,
                      field=f"pool_size + eval_examples = {config.pool_size} + {config.eval_examples}")
    require_sequences("validation", count(splits.validation), config.validation_examples, seq_len=unit_length,
                      field=f"validation_examples={config.validation_examples}")
    too_large = [(M, K) for M, K in config.budgets if 4 * (M + K) > config.pool_size]
    if too_large:
        raise ValueError(f"budgets {too_large} have M + K > pool_size / 4 = {config.pool_size // 4}: the train and "
                         "test means would share too much of the pool to be independent; use smaller budgets or a "
                         "larger pool")
    epochs = check_epochs(training_epochs(config.steps, config.batch_size, count(splits.train)),
                          max_epochs=config.max_epochs, stacklevel=3)
    return {"epochs": round(epochs, 3), "unit": splits.unit, **splits.summary}


def _unit_length(splits: Splits) -> int:
    first = splits.train[0] if isinstance(splits.train, (tuple, list)) else splits.train
    return int(first.shape[1]) if first.ndim == 2 else 1


def _generator(*key) -> torch.Generator:
    return torch.Generator().manual_seed(derived_seed("dalign", *key))


def draw_pools(config: SweepConfig, splits: Splits) -> Pools:
    """Random pools without replacement, from ``config.seed`` alone (so every width and seed sees the same ones)."""
    test_order = torch.randperm(count(splits.test), generator=_generator("pools", "test", config.seed))
    return Pools(
        train=torch.randperm(count(splits.train), generator=_generator("pools", "train", config.seed))[
            : config.pool_size],
        heldout=test_order[: config.pool_size],
        evaluation=test_order[config.pool_size: config.pool_size + config.eval_examples],
        validation=torch.randperm(count(splits.validation), generator=_generator("pools", "val", config.seed))[
            : config.validation_examples],
    )


def prepare(config: SweepConfig, family: Family) -> tuple[Splits, dict[str, Any], Pools]:
    """The family's data, checked to supply the config (the facts for the provenance), and the pools."""
    splits = family.load_data(config)
    return splits, check_supply(config, splits), draw_pools(config, splits)


def checkpoint_root(config: SweepConfig, family: Family) -> Path:
    """``checkpoints/<profile>/<family>/<hash>``: keyed by the fields that determine the weights.

    Changing how models are measured (pools, budgets, resamples) reuses the trained
    models. Override the root with ``DALIGN_CHECKPOINTS``.
    """
    root = Path(os.environ.get("DALIGN_CHECKPOINTS") or REPO_ROOT / "checkpoints")
    names = config.SHARED_TRAINING_FIELDS + family.training_fields
    fields = {name: getattr(config, name) for name in names}
    key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return root / config.profile / family.name / key


def _train_config(config: SweepConfig, family: Family, width: int, seed: int, lr: float,
                  trial: bool = False) -> TrainConfig:
    """The training of a measured run, or with ``trial`` (and ``lr_trial_fraction < 1``) of a short rate trial.

    A short trial has its own warmup and decay over ``trial_steps`` and keeps no analysis checkpoints.
    """
    short = trial and config.trial_steps < config.steps
    steps = config.trial_steps if short else config.steps
    name = f"N{width}_seed{seed}_lr{lr:g}" + (f"_trial{steps}" if short else "")
    return TrainConfig(
        steps=steps, batch_size=config.batch_size, lr=lr,
        warmup_steps=max(round(config.warmup_steps * steps / config.steps), 1) if short else config.warmup_steps,
        weight_decay=config.weight_decay, seed=seed, autocast_dtype=config.autocast_dtype,
        checkpoint_dir=str(checkpoint_root(config, family) / name),
        checkpoint_every=max(steps // max(config.resume_points, 1), 1),
        checkpoint_steps=(steps,) if short else config.checkpoint_steps,
        progress=sys.stderr.isatty(), **family.train_settings(config),
    )


def trained_model(config: SweepConfig, family: Family, splits: Splits, width: int, seed: int, lr: float,
                  device: torch.device | str = "cpu") -> torch.nn.Module:
    """The model a sweep trained at ``(width, seed, lr)``, at its final step and in eval mode.

    Loaded from the sweep's checkpoints (:func:`checkpoint_root`); where they are gone, the
    run is trained again, which gives the same weights on the same machine. Raises
    ``RuntimeError`` if that training diverges.
    """
    model, result, failure = _train(config, family, splits, width, seed, lr, torch.device(device))
    if result is None:
        raise RuntimeError(f"{family.name} N={width} seed={seed} lr={lr:g} diverged ({failure}); it has no trained "
                           "model to load")
    return model.eval()


def _train(config, family, splits, width, seed, lr, device, group=None, trial=False):
    """Train (or resume, or load a finished run); returns (model, TrainResult or None, failure message).

    ``group``: the process group of a job that several ranks train together (data parallel).
    ``trial``: a rate trial (:func:`_train_config`).
    """
    model = family.build(config, width, seed, splits).to(device)
    try:
        result = train(model, splits.train, _train_config(config, family, width, seed, lr, trial),
                       loss_fn=family.train_loss, description=f"{family.name} N={width} seed={seed} lr={lr:g}",
                       group=group)
    except FloatingPointError as err:  # diverged: a failed run, reported, never measured
        return model, None, str(err)
    return model, result, ""


def _rate_trial(config, family, splits, pools, width, lr, device, group=None, trial=True) -> dict | None:
    """Train the first seed at rate ``lr`` and score it on the validation pool: one row of ``<family>_lr``.

    ``trial=False`` trains at full length (the full-length check of the fit). In a job group only the
    group's first rank scores it (the others return None).
    """
    model, result, failure = _train(config, family, splits, width, config.seed, lr, device, group, trial)
    if group is not None and torch.distributed.get_rank(group) != 0:
        return None
    validation = take(splits.validation, pools.validation)
    loss = family.heldout_metric(model.eval(), validation, config) if result is not None else math.inf
    steps = config.trial_steps if trial else config.steps
    log.info("%s N=%d lr=%g (%d steps): validation loss %.4f", family.name, width, lr, steps, loss)
    return dict(family=family.name, width=width, seed=config.seed, lr=lr, steps=steps, validation_loss=loss,
                diverged=result is None, failure=failure)


def _choose_rate(rows: list[dict], grid: tuple[float, ...]) -> list[dict]:
    """A width's rate-trial rows with ``chosen``: the lowest validation loss wins (ties: the smaller rate)."""
    finite = [row for row in rows if math.isfinite(row["validation_loss"])]
    chosen = min(finite, key=lambda row: (row["validation_loss"], row["lr"]))["lr"] if finite else min(grid)
    return [{**row, "chosen": row["lr"] == chosen} for row in rows]


def _extended(grid: tuple[float, ...], chosen: float) -> tuple[float, ...] | None:
    """``grid`` with one more rate past the edge where ``chosen`` sits (the grid's own ratio), or None inside."""
    if len(grid) < 2:
        return None
    if chosen == grid[0]:
        return (float(f"{grid[0] * grid[0] / grid[1]:.3g}"), *grid)
    if chosen == grid[-1]:
        return (*grid, float(f"{grid[-1] * grid[-1] / grid[-2]:.3g}"))
    return None


def _prune_candidates(config, family, width, rows) -> None:
    """With ``prune_candidates``, delete the checkpoints of the trials whose rate a width did not keep."""
    if config.prune_candidates:
        for row in rows:
            if not row["chosen"]:
                shutil.rmtree(_train_config(config, family, width, config.seed, row["lr"], trial=True).checkpoint_dir,
                              ignore_errors=True)



def trained_only(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs that trained (an empty table stays empty)."""
    return table[table.trained_ok.astype(bool)] if "trained_ok" in table else table


TREND_KEYS = ["quantity", "view", "reduction", "layer", "pool", "setting", "M", "K", "step", "loss_level", "judged"]
"""What tells trend rows apart; :data:`dalign_core.sweep.trend.SLOPE_COLUMNS` follow them."""


def trend_table(config: SweepConfig, geometry: pd.DataFrame, misalignment: pd.DataFrame,
                primary: str | None = None, judged_reduction: str = "shared") -> pd.DataFrame:
    """Slope tests of width trends (:mod:`dalign_core.sweep.trend`): one row per (quantity, view, group).

    Views: ``late_window`` (each run's mean of log X over the last third's checkpoints; X = d_align,
    d_par, d_2), ``step`` (each checkpoint on its own, for the figure along training),
    ``matched_loss`` (log d_align interpolated where each run reaches a common held-out loss) and
    ``budget`` (logit p̂ at the final checkpoint, per (M, K)). ``judged`` marks the three rows the width
    claims read: d_align's late window and its base loss level on the held-out pool at ``primary`` with
    ``judged_reduction``, and p̂ at ``config.budget_judged`` in the heldout/heldout setting.
    """
    ok = trained_only(geometry)
    if "reduction" not in ok:
        ok = ok.assign(reduction="shared")
    tested = dict(confidence=config.confidence)
    rows = []

    def add(summaries, keys, by, reference=trend.PAPER_SLOPE):
        for key, part in summaries.groupby(by, sort=True, dropna=False) if by else [((), summaries)]:
            key = key if isinstance(key, tuple) else (key,)
            rows.append({**keys, **dict(zip(by, key)), **trend.slope_test(part, reference, **tested)})

    groups = ["reduction", "layer", "pool"]
    if not ok.empty:
        for quantity in ("d_align", "d_par", "d_2"):
            add(trend.run_summaries(ok, quantity, config.last_third, groups), dict(quantity=quantity,
                                                                                    view="late_window"), groups)
        for step in sorted(ok.step.unique()):
            add(trend.run_summaries(ok, "d_align", [step], groups), dict(quantity="d_align", view="step",
                                                                         step=int(step)), groups)
        at_primary = ok[ok.layer == primary] if primary is not None else ok
        matched = trend.matched_loss_summaries(at_primary, "d_align", config.matched_loss_offsets, groups)
        add(matched, dict(quantity="d_align", view="matched_loss"), [*groups, "loss_level"])
    ok_mis = trained_only(misalignment)
    if not ok_mis.empty and "setting" in ok_mis:
        ok_mis = ok_mis[ok_mis.setting != "evaluation/evaluation"]  # one p̂ per (model, budget, law pair)
    if not ok_mis.empty:
        logits = ok_mis.assign(y=trend.logit_clip(ok_mis.p_misalign, ok_mis.trials))
        add(logits, dict(quantity="p_misalign", view="budget"), ["layer", "setting", "M", "K"],
            reference=-trend.PAPER_SLOPE)
    if not rows:
        return pd.DataFrame(columns=[*TREND_KEYS, *trend.SLOPE_COLUMNS])
    table = pd.DataFrame(rows).reindex(columns=[*TREND_KEYS, *trend.SLOPE_COLUMNS])
    base_level = table.loc[table.view == "matched_loss", "loss_level"].min()
    M, K = config.budget_judged
    table["judged"] = (
        ((table.quantity == "d_align") & (table.layer == primary) & (table.pool == "heldout")
         & (table.reduction == judged_reduction)
         & ((table.view == "late_window") | ((table.view == "matched_loss") & (table.loss_level == base_level))))
        | ((table.view == "budget") & (table.setting == "heldout/heldout") & (table.M == M) & (table.K == K)))
    return table



def _measured_run(config, family, splits, pools, width, seed, lr, baseline, device, group=None) -> dict | None:
    """Train (or load) one (width, seed) run at rate ``lr`` and measure it: its rows for every table.

    In a job group every rank trains, and the group's first rank alone measures (the others return None).
    """
    started = time.perf_counter()
    model, result, failure = _train(config, family, splits, width, seed, lr, device, group)
    if group is not None and torch.distributed.get_rank(group) != 0:
        return None
    base = dict(family=family.name, model=family.model_name(config, width), width=width, seed=seed, lr=lr,
                parameters=sum(p.numel() for p in model.parameters()), baseline_loss=baseline)
    if result is None:
        log.warning("%s N=%d seed=%d: training diverged (%s)", family.name, width, seed, failure)
        return {"runs": [{**base, "heldout_loss": math.nan, "final_train_loss": math.nan, "trained_ok": False,
                          "failure": failure}]}
    # trained_ok is known only after the final evaluation; measure, then stamp it on every row.
    geometry_rows, final, heldout_loss, quality = _measure(config, family, model, result, splits, pools,
                                                           {**base, "trained_ok": None}, device)
    failure = family.failure(config, heldout_loss, baseline, quality)
    trained_ok = not failure
    run = {**base, "heldout_loss": heldout_loss, **quality, "trained_ok": trained_ok, "failure": failure,
           "final_train_loss": result.history[-1]["loss"] if result.history else math.nan,
           # weights loaded from an earlier invocation's finished run: its training time is not in this one's
           "training_loaded": result.resumed_from == config.steps}
    for row in geometry_rows:
        row["trained_ok"] = trained_ok
    heldout = take(splits.test, pools.heldout)
    redundancy = [] if not config.redundancy_examples else [
        {**{k: run[k] for k in ("family", "model", "width", "seed")}, **row, "trained_ok": trained_ok}
        for row in _redundancy(config, family, model, heldout, config.redundancy_examples, device, seed)]
    rows = {"geometry": geometry_rows, "redundancy": redundancy,
            "misalignment": _misalignment(config, final, run, family.primary_layer(config), family.reductions[0]),
            **family.extra_rows(config, model, heldout, run)}
    seconds = time.perf_counter() - started
    log.info("%s N=%d seed=%d lr=%g: held-out loss %.3f (baseline %.3f) %s; %.0f s", family.name, width, seed, lr,
             heldout_loss, baseline, "ok" if trained_ok else "FAILED", seconds)
    return {**rows, "runs": [{**run, "seconds": round(seconds, 1)}]}


def jobs_dir(out_dir: str | Path, config: SweepConfig, family: Family) -> Path:
    """Where a sweep keeps each finished job's rows until its tables are written: ``<out>/partial/<family>-<hash>``."""
    return Path(out_dir) / "partial" / f"{family.name}-{config.config_hash()}"


def _trial_name(width: int, lr: float) -> str:
    return f"lr_N{width}_lr{lr:g}"


def _job_grid(config: SweepConfig, group_sizes: dict[int, int], training: dict[int, float],
              measuring: dict[int, float], grids: dict[int, tuple[float, ...]] | None = None) -> tuple[list, list]:
    """The sweep's jobs: the (width, rate) trials of the rate fit, then the measured (width, seed) runs.

    ``training`` and ``measuring``: the cost of one full training and of measuring one trained
    run at each width (any unit); ``grids``: the rates to try, by width (default: the grid of each of
    :attr:`SweepConfig.fitted_widths`). Where trials run at full length, the first seed's measured run
    reuses the chosen trial's training, so it is a measurement on one rank; so does the widest width's
    where the full-length check (:func:`_check_jobs`) trained it.
    """
    grids = grids or {width: config.lr_grid(width) for width in config.fitted_widths}
    short = config.trial_steps < config.steps
    fraction = config.trial_steps / config.steps

    def reused(width: int, seed: int) -> bool:
        return seed == config.seed and ((not short and width in config.fitted_widths)
                                        or (config.full_check and width == max(config.widths)))

    trials = [distributed.Job(_trial_name(width, lr), cost=training[width] * fraction, ranks=group_sizes[width],
                              payload=(width, lr)) for width in grids for lr in grids[width]]
    runs = [distributed.Job(f"N{width}_seed{seed}", payload=(width, seed),
                            cost=measuring[width] + (0.0 if reused(width, seed) else training[width]),
                            ranks=1 if reused(width, seed) else group_sizes[width])
            for width in config.widths for seed in range(config.seed, config.seed + config.seeds)]
    return trials, runs


def _check_jobs(config: SweepConfig, group_sizes: dict[int, int], training: dict[int, float],
                rates: list[float]) -> list:
    """The full-length check of the rate fit: the widest width trained at ``rates`` (two of them)."""
    width = max(config.widths)
    return [distributed.Job(f"full_N{width}_lr{lr:g}", cost=training[width], ranks=group_sizes[width],
                            payload=(width, lr)) for lr in rates]


def _planned_checks(config: SweepConfig, group_sizes: dict[int, int], training: dict[int, float]) -> list:
    """The full-length check's jobs as a plan counts them before any rate is known (their cost is not the rates')."""
    if not config.full_check:
        return []
    return _check_jobs(config, group_sizes, training, list(config.lr_grid(max(config.widths))[:2]))


def trainings(config: SweepConfig) -> dict[int, float]:
    """Full trainings each width costs (trials at their fraction of ``steps``), from the sweep's own job grid:
    the rate trials, the seeds whose training no trial or check made, and the widest width's full-length check.
    Grid extensions and a failed transfer (:attr:`SweepConfig.lr_fit`) are not counted: they depend on results."""
    ones, zeros = {w: 1.0 for w in config.widths}, {w: 0.0 for w in config.widths}
    trials, runs = _job_grid(config, {w: 1 for w in config.widths}, ones, zeros)
    checks = _planned_checks(config, {w: 1 for w in config.widths}, ones)
    return {width: sum(job.cost for job in trials + runs + checks if job.payload[0] == width)
            for width in config.widths}


def _ranked(rows: list[dict]) -> list[dict]:
    """Rate-trial rows with a finite validation loss, best first (ties: the smaller rate)."""
    return sorted((row for row in rows if math.isfinite(row["validation_loss"])),
                  key=lambda row: (row["validation_loss"], row["lr"]))


def _fit_grids(config, family, splits, pools, device, folder, group_sizes, training, widths) -> dict[int, list[dict]]:
    """The rate trials of ``widths``, each width's rows with ``chosen``; a width whose best rate sits at an edge of
    its grid tries one rate past that edge (up to ``lr_extend`` times)."""
    grids = {width: config.lr_grid(width) for width in widths}
    costs = {w: 0.0 for w in config.widths}

    def width_fitted(job, lookup):  # prune a width's other candidates as soon as its last trial is in
        width = job.payload[0]
        rows = [lookup(_trial_name(width, lr)) for lr in grids[width]]
        if all(row is not None for row in rows):
            _prune_candidates(config, family, width, _choose_rate(rows, grids[width]))

    for extension in range(config.lr_extend + 1):
        trials, _ = _job_grid(config, group_sizes, training, costs, grids)
        trial_rows = distributed.run_jobs(
            folder, trials, lambda job, group: _rate_trial(config, family, splits, pools, *job.payload, device, group),
            finished=width_fitted)
        lr_rows = {width: _choose_rate([trial_rows[_trial_name(width, lr)] for lr in grids[width]], grids[width])
                   for width in widths}
        grown = {width: _extended(grids[width], next(r["lr"] for r in rows if r["chosen"]))
                 for width, rows in lr_rows.items()}
        grown = {width: grid for width, grid in grown.items() if grid is not None}
        if not grown or extension == config.lr_extend:
            break
        log.info("%s: best rate at the edge of its grid at N=%s; trying one more rate past it", family.name,
                 "/".join(map(str, grown)))
        grids.update(grown)
    return {width: [{**row, "check": False} for row in rows] for width, rows in lr_rows.items()}


def _full_check(config, family, splits, pools, device, folder, group_sizes, training, rates) -> list[dict]:
    """The widest width trained at ``rates`` for all ``steps`` and scored on the validation pool: ``check`` rows,
    the lowest validation loss ``chosen`` (ties: the smaller rate)."""
    checks = _check_jobs(config, group_sizes, training, rates)
    full = distributed.run_jobs(folder, checks, lambda job, group: _rate_trial(
        config, family, splits, pools, *job.payload, device, group, trial=False))
    rows = [full[job.name] for job in checks]
    best = _ranked(rows)[0]["lr"] if _ranked(rows) else None
    return [{**row, "chosen": row["lr"] == best, "check": True} for row in rows]


def _fit_each_width(config, family, splits, pools, device, folder, group_sizes, training):
    """``lr_fit='each_width'``: every width's trials; with short trials, the widest width's best two trial rates
    trained at full length (the check of the short fit). Returns (rate by width, rows by width)."""
    lr_rows = _fit_grids(config, family, splits, pools, device, folder, group_sizes, training, config.widths)
    if config.trial_steps < config.steps:
        width = max(config.widths)
        lr_rows[width] += _full_check(config, family, splits, pools, device, folder, group_sizes, training,
                                      [row["lr"] for row in _ranked(lr_rows[width])[:2]])
    chosen = {width: next(row["lr"] for row in rows if row["chosen"] and not row["check"])
              for width, rows in lr_rows.items()}
    return chosen, lr_rows


def _transfer_rates(config: SweepConfig, rows: list[dict]) -> tuple[dict[int, float], float]:
    """The narrowest width's kept rate carried to every width, and the rate the widest width checks it against:
    the grid neighbour on the side of the narrowest width's runner-up (the other side at an edge of the grid)."""
    grid = sorted(row["lr"] for row in rows)
    fitted = next(row["lr"] for row in rows if row["chosen"])
    ranked = [row["lr"] for row in _ranked(rows) if row["lr"] != fitted]
    here = grid.index(fitted)
    side = 1 if ranked and ranked[0] > fitted else -1
    other = here + side if 0 <= here + side < len(grid) else here - side
    widest = max(config.widths)
    return ({width: config.scaled_rate(fitted, width) for width in config.widths},
            config.scaled_rate(grid[other], widest))


def _fit_rates(config, family, splits, pools, device, folder, group_sizes, training):
    """Each width's rate and the rate-fit rows (``<family>_lr``) by width; see :attr:`SweepConfig.lr_fit`.

    Under ``transfer`` the narrowest width's trials are the only ones, the widest width's check rows say which
    rate was ``carried``, and where the neighbour beats the carried rate the sweep fits every width instead,
    keeping the failed check's rows.
    """
    if not config.transfers_rate:
        return _fit_each_width(config, family, splits, pools, device, folder, group_sizes, training)
    narrowest, widest = min(config.widths), max(config.widths)
    fitted = _fit_grids(config, family, splits, pools, device, folder, group_sizes, training, [narrowest])
    carried, neighbour = _transfer_rates(config, fitted[narrowest])
    check = _full_check(config, family, splits, pools, device, folder, group_sizes, training,
                        [carried[widest], neighbour])
    check = [{**row, "carried": row["lr"] == carried[widest]} for row in check]
    if any(row["carried"] and row["chosen"] for row in check):
        return carried, {narrowest: fitted[narrowest], widest: check}
    # info, not a warning: the failed check is a result the rate-fit table and the chapter report
    log.info("%s: the rate carried from N=%d (%g at N=%d) lost to its neighbour %g at full length; the transfer "
             "failed, so every width is fitted on its own grid", family.name, narrowest, carried[widest], widest,
             neighbour)
    chosen, lr_rows = _fit_each_width(config, family, splits, pools, device, folder, group_sizes, training)
    lr_rows[widest] = lr_rows[widest] + check
    return chosen, lr_rows


def lr_check(lr: pd.DataFrame) -> dict[str, Any]:
    """The full-length check of the rate fit at the widest width, read from the ``<family>_lr`` table.

    Returns ``{}`` where nothing was checked. For a short-trial fit of every width (``method``
    ``each_width``): the width, the two rates with their full-length validation losses, ``passed``
    (the short trials' choice also won at full length) and ``margin`` (nats between the two). For a
    transfer (``method`` ``transfer``): the width, the ``fitted_width`` and its ``fitted`` rate, the
    ``carried`` rate and its ``neighbour``, their ``losses``, ``passed`` (the carried rate won) and
    ``margin``; where it failed, ``fallback`` holds the check of the fit of every width, if any.
    """
    if "check" not in lr or not lr.check.astype(bool).any():
        return {}
    checked = lr[lr.check.astype(bool)]
    transfer = checked[checked.carried.notna()] if "carried" in checked else checked.iloc[:0]
    plain = checked.drop(transfer.index)

    def losses(rows):
        return {f"{row.lr:g}": float(row.validation_loss) for row in rows.itertuples()}

    def margin(rows):
        return float(rows.validation_loss.max() - rows.validation_loss.min()) if len(rows) > 1 else 0.0

    summary = {}
    if len(plain):
        width = int(plain.width.iloc[0])
        trials = lr[(~lr.check.astype(bool)) & (lr.width == width)]
        short_choice = float(trials[trials.chosen.astype(bool)].lr.iloc[0])
        full_choice = float(plain[plain.chosen.astype(bool)].lr.iloc[0])
        summary = dict(method="each_width", width=width, short_choice=short_choice, full_choice=full_choice,
                       passed=short_choice == full_choice, losses=losses(plain), margin=margin(plain))
    if len(transfer):
        width = int(transfer.width.iloc[0])
        fitted_width = int(lr[~lr.check.astype(bool)].width.min())
        fitted = lr[(~lr.check.astype(bool)) & (lr.width == fitted_width) & lr.chosen.astype(bool)]
        carried = transfer[transfer.carried.eq(True)]
        won = bool(carried.chosen.astype(bool).iloc[0])
        summary = dict(method="transfer", width=width, fitted_width=fitted_width, fitted=float(fitted.lr.iloc[0]),
                       carried=float(carried.lr.iloc[0]),
                       neighbour=float(transfer[transfer.carried.eq(False)].lr.iloc[0]), losses=losses(transfer),
                       passed=won, margin=margin(transfer), **({} if won else {"fallback": summary}))
    return summary


def run_sweep(config: SweepConfig, family: Family, jobs: str | Path | None = None, ranks_per_job: str | None = None,
              keep_jobs: bool = False) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Run the whole sweep; returns (tables by name, provenance extras). See the module docstring.

    With ``jobs`` (see :func:`jobs_dir`), every finished job — a (width, rate) trial of
    the rate fit, a measured (width, seed) run — is kept there as it finishes, so a rerun
    of the same config after an interruption computes only what is missing and gives the
    same tables as an uninterrupted run. The folder is removed once the tables are built
    (``keep_jobs``: left for the caller, who removes it once the tables are safe).

    Under ``torchrun`` the ranks share these jobs (:mod:`dalign_core.training.distributed`): the
    rate trials first, then — every rank reading the chosen rates from ``jobs``, which must
    be on a filesystem they share — the measured runs; rank 0 returns the tables, the
    other ranks ``({}, {})``. ``ranks_per_job`` (or ``$DALIGN_RANKS_PER_JOB``, see
    :func:`dalign_core.training.distributed.ranks_per_job`) trains the widest models on several
    ranks together.
    """
    torch.use_deterministic_algorithms(True, warn_only=True)
    ctx = distributed.init(config.device)
    device = distributed.local_device(config.device)
    if config.profile in GPU_PROFILES and config.device == "auto" and device.type == "cpu":
        raise RuntimeError(
            f"{family.name}: profile {config.profile!r} trains models sized for a GPU and this machine has none, so "
            f"it would take hours here. Run it on a GPU machine (scripts/gpu_run.sh), copy results/{config.profile}/ "
            "back, or choose a smaller profile (cpu); device='cpu' in the config runs it here anyway, and --dry-run "
            "projects how long that would take.")
    with distributed.main_first():  # rank 0 fills the data caches (tokenizer, downloads) before the others read them
        splits, facts, pools = prepare(config, family)
    baseline = family.baseline(splits, take(splits.test, pools.evaluation), config)
    log.info("%s: %s; baseline held-out loss %.3f", family.name, splits.unit, baseline)
    folder = Path(jobs) if jobs is not None else None
    group_sizes = distributed.ranks_per_job(config.widths, ctx.world_size, ranks_per_job)
    for width, size in group_sizes.items():
        if config.batch_size % size:
            raise ValueError(f"{family.name} N={width}: batch_size {config.batch_size} does not split over {size} "
                             "ranks; choose a number of ranks per job that divides it")

    # ---- 1. the rate fit: every (width, rate) trial is a job; a width's choice is read from all of its trials
    # costs only balance the ranks' shares: training ~ N^2, measuring a trained run ~ a tenth of that
    training, measuring = {w: float(w) ** 2 for w in config.widths}, {w: 0.1 * float(w) ** 2 for w in config.widths}
    chosen, lr_rows = _fit_rates(config, family, splits, pools, device, folder, group_sizes, training)
    _, runs = _job_grid(config, group_sizes, training, measuring)

    # ---- 2. the measured runs at the chosen rates (with full-length trials, the first seed's training is the
    # chosen trial's: measured only)
    measured = distributed.run_jobs(folder, runs, lambda job, group: _measured_run(
        config, family, splits, pools, *job.payload, chosen[job.payload[0]], baseline, device, group), collect="main")
    if not ctx.is_main:
        return {}, {}

    # ---- 3. rank 0 (or the only process) merges the jobs into the tables
    tables: dict[str, list[dict]] = defaultdict(list)
    for width in config.widths:
        tables["lr"] += lr_rows.get(width, [])
        for seed in range(config.seed, config.seed + config.seeds):
            for name, rows in measured[f"N{width}_seed{seed}"].items():
                tables[name] += rows
    frames = {name: pd.DataFrame(tables.get(name, [])) for name in SWEEP_TABLES + family.extra_tables}
    frames["trend"] = trend_table(config, frames["geometry"], frames["misalignment"], family.primary_layer(config),
                                  family.reductions[0])
    frames = {name: _stamp(frame, family.columns(config)) for name, frame in frames.items()}
    # The runs themselves are <family>_runs.csv: the provenance names the table and counts them.
    runs_table = frames["runs"]
    extra = dict(data=facts, device=str(device),
                 runs=dict(table=f"{family.name}_runs.csv", count=len(runs_table),
                           trained_ok=int(runs_table.trained_ok.astype(bool).sum()) if len(runs_table) else 0,
                           training_loaded=int(runs_table.training_loaded.fillna(False).astype(bool).sum())
                           if "training_loaded" in runs_table else 0),
                 pools={name: len(getattr(pools, name)) for name in ("train", "heldout", "evaluation", "validation")},
                 power_plan=config.power_plan(), lr_check=lr_check(frames["lr"]),
                 judged=dict(layer=family.primary_layer(config), reduction=family.reductions[0],
                             budget=list(config.budget_judged)))
    if any(size > 1 for size in group_sizes.values()):
        extra["ranks_per_job"] = {str(width): size for width, size in group_sizes.items()}
    if folder is not None and not keep_jobs:
        distributed.remove_jobs(folder)  # and <out>/partial with it when nothing else is left there
    return {f"{family.name}_{name}": frame for name, frame in frames.items()}, extra


def _stamp(frame: pd.DataFrame, columns: dict[str, Any]) -> pd.DataFrame:
    """``frame`` with ``columns`` (name → value) inserted at the front, so sibling sweeps' tables concatenate."""
    frame = frame.copy()
    for position, (name, value) in enumerate(columns.items()):
        frame.insert(position, name, [value] * len(frame))
    return frame


def run_sweeps(configs: list[SweepConfig], family: Family, out_dir: str | Path | None = None
               ) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Several sweeps of one family (depth regimes, data sets) as one experiment's tables.

    Each config is a sweep of its own — its own rate fits, pools, trends and job folder
    under ``out_dir`` — told apart by :meth:`Family.columns`, which every row carries.
    The provenance keeps each sweep's data facts and count of runs under its columns' values.
    Under ``torchrun`` the sweeps run one after another, each over all ranks; rank 0
    returns the tables, the other ranks ``({}, {})``.
    """
    tables: dict[str, list[pd.DataFrame]] = defaultdict(list)
    sweeps = []
    for config in configs:
        # Every regime's finished jobs stay until the last regime is done: an interruption then loses none of them.
        frames, extra = run_sweep(config, family, jobs=jobs_dir(out_dir, config, family) if out_dir else None,
                                  keep_jobs=True)
        for name, frame in frames.items():
            tables[name].append(frame)
        sweeps.append({**family.columns(config), **extra})
    if not distributed.context().is_main:
        return {}, {}
    merged = {name: pd.concat([f for f in frames if not f.empty] or frames[:1], ignore_index=True)
              for name, frames in tables.items()}
    if out_dir:
        for config in configs:
            distributed.remove_jobs(jobs_dir(out_dir, config, family))
    return merged, dict(sweeps=sweeps)


def dry_run(config: SweepConfig, family: Family, steps: int = 2) -> str:
    """Build the data and every model, time ``steps`` training steps, one capture batch, one evaluation batch and the
    redundancy check on one batch, and project the full run.

    Each model first takes ``steps`` warm-up steps; on a GPU at least 20 steps are timed.

    Returns the projection as text, the arithmetic shown. Nothing is
    written to the results folder and no checkpoint is kept.
    """
    device = resolve_device(config.device)
    # A GPU's clocks ramp up over the first fraction of a second: a couple of steps overstate its step time
    # (seen on an H200: 472 ms/step timed over 2 steps where whole runs went more than twice as fast).
    steps = steps if device.type == "cpu" else max(steps, 20)
    splits, facts, pools = prepare(config, family)
    heldout, evaluation = take(splits.test, pools.heldout), take(splits.test, pools.evaluation)
    runs_at = trainings(config)  # full-run equivalents at each width, from the sweep's job grid
    # pool captures per measured run, in pools' worth of examples (each checkpoint's share is checkpoint_pool's), as
    # _measure makes them: every layer at all_layer_steps, else the primary one; all reductions share each pass
    passes = [(step in config.train_pool_checkpoints) + 1 for step in config.checkpoint_steps]
    share = [len(checkpoint_pool(config, torch.arange(config.pool_size), step)) / config.pool_size
             for step in config.checkpoint_steps]
    every_layer = sum(n * f for step, n, f in zip(config.checkpoint_steps, passes, share) if config.layer_steps(step))
    primary_only = sum(n * f for n, f in zip(passes, share)) - every_layer
    pool_passes = every_layer + primary_only
    lines = [f"dry run of {family.name} at profile {config.profile} on {device}: {count(splits.train)} train, "
             f"{count(splits.validation)} validation, {count(splits.test)} test {splits.unit}; "
             f"{facts['epochs']:.2f} epochs per run",
             f"rate fit ({config.lr_fit}): {len(config.lr_candidates)} trials of {config.trial_steps} steps at "
             + ("every width" if len(config.fitted_widths) > 1 else f"N={config.fitted_widths[0]}")
             + (f", then 2 trainings at N={max(config.widths)} for the full-length check" if config.full_check else "")
             + " (grid extensions not counted)",
             f"per width: {config.seeds} measured runs x "
             f"{pool_passes:.3g} pool captures ({every_layer:.3g} at every insertion point, {primary_only:.3g} at the "
             f"primary one; {len(family.reductions)} reduction(s) from each backward pass) of {config.pool_size} "
             f"examples" + (f" (checkpoints before the last capture {min(share) * config.pool_size:.0f} of them)"
                            if min(share) < 1 else "")]
    total = 0.0
    training_seconds, measuring_seconds = {}, {}
    from tqdm import tqdm  # a width's timing takes minutes at the gpu profile: show progress with an ETA

    for width in tqdm(config.widths, desc=f"dry run of {family.name}: timing each width", unit="width",
                      disable=None):
        model = family.build(config, width, config.seed, splits).to(device)
        probe = TrainConfig(steps=steps, batch_size=config.batch_size, lr=min(config.lr_grid(width)),
                            seed=config.seed, autocast_dtype=config.autocast_dtype, progress=False,
                            **family.train_settings(config))
        train(model, splits.train, probe, loss_fn=family.train_loss)  # warm-up: kernels, allocator, caches
        _sync(device)
        start = time.perf_counter()
        train(model, splits.train, probe, loss_fn=family.train_loss)
        _sync(device)
        per_step = (time.perf_counter() - start) / steps
        model.eval()
        batch = family.batches(take(heldout, torch.arange(min(config.capture_batch, count(heldout)))),
                                config.capture_batch)
        per_capture = {}
        for which, layers in (("every", family.insertion_points(config, model)), ("primary", [family.primary_layer(config)])):
            accumulate_geometry(model, layers, batch, reduction=list(family.reductions), device=device)  # warm-up
            _sync(device)
            start = time.perf_counter()
            accumulate_geometry(model, layers, batch, reduction=list(family.reductions), device=device,
                                check_determinism=False)
            _sync(device)
            per_capture[which] = (time.perf_counter() - start) * config.pool_size / config.capture_batch
        # the rest of a measured run: the held-out evaluation at every checkpoint, the capture of the evaluation
        # set for the certificates' out-of-sample check, and the redundancy check's per-example gradients
        probe_examples = take(evaluation, torch.arange(min(config.capture_batch, count(evaluation))))
        family.evaluate(model, probe_examples, config)  # warm-up
        _sync(device)
        start = time.perf_counter()
        family.evaluate(model, probe_examples, config)
        _sync(device)
        per_evaluation = (time.perf_counter() - start) * config.eval_examples / count(probe_examples)
        per_redundancy = 0.0
        if config.redundancy_examples:
            probe = min(config.redundancy_examples, config.capture_batch, count(heldout))
            _redundancy(config, family, model, heldout, min(8, probe), device, config.seed)  # warm-up, as above
            _sync(device)
            start = time.perf_counter()
            _redundancy(config, family, model, heldout, probe, device, config.seed)
            _sync(device)
            per_redundancy = (time.perf_counter() - start) * config.redundancy_examples / probe
        training = per_step * config.steps * runs_at[width]
        per_run = (per_capture["every"] * every_layer + per_capture["primary"] * primary_only
                   + per_evaluation * len(config.checkpoint_steps)
                   + per_capture["primary"] * config.eval_examples / config.pool_size + per_redundancy)
        measuring = per_run * config.seeds
        total += training + measuring
        training_seconds[width], measuring_seconds[width] = per_step * config.steps, per_run
        lines.append(f"  N={width}: {per_step * 1e3:.1f} ms/step x {config.steps} steps x {runs_at[width]:.3g} = "
                     f"{training:.0f} s training; ({per_capture['every']:.2f} s x {every_layer:.3g} + "
                     f"{per_capture['primary']:.2f} s x {primary_only:.3g} capture, {per_evaluation:.2f} s x "
                     f"{len(config.checkpoint_steps)} evaluation, {per_redundancy:.2f} s redundancy) per run x "
                     f"{config.seeds} = {measuring:.0f} s measuring")
        del model
    lines.append(f"projected: {_seconds(total)} s ({total / 60:.1f} min) plus resampling and start-up")
    def shared(world: int) -> float:  # the plan's makespan: rates, their check, then seeds, longest job first
        sizes = distributed.ranks_per_job(config.widths, world)
        trials, runs = _job_grid(config, sizes, training_seconds, measuring_seconds)
        checks = _planned_checks(config, sizes, training_seconds)
        return sum(max((a.end for a in distributed.plan(jobs, world)), default=0.0) for jobs in (trials, checks, runs))

    local = workers.count() if distributed.context().world_size == 1 else 1
    if local > 1:  # what a plain `python -m ...` on this machine does by default
        seconds = shared(local)
        lines.append(f"on this machine's {local} one-thread workers (the default; DALIGN_WORKERS): "
                     f"{_seconds(seconds)} s ({seconds / 60:.1f} min), if nothing else runs")
    for world in sorted({8, distributed.context().world_size} - {1}):
        seconds = shared(world)
        lines.append(f"on {world} such devices sharing the jobs (torchrun --nproc_per_node={world}; the plan of "
                     f"dalign_core.training.distributed, rates first, then seeds): {_seconds(seconds)} s "
                     f"({seconds / 60:.1f} min)")
    return "\n".join(lines)


def _seconds(seconds: float) -> str:
    """Seconds to at least 4 significant digits, and no exponent: a short toy run's projection stays readable."""
    return f"{seconds:.0f}" if seconds >= 1000 else f"{seconds:.4g}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
