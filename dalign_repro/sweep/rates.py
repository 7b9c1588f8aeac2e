"""Step 1 of the sweep: a learning rate that fits each width (see :mod:`dalign_repro.sweep.run`).

* ``_rate_trial``: the first seed trained at one rate and scored on the validation pool.
* ``_fit_grids``: every rate of a width's grid, one more past an edge where the best rate sits there.
* ``_full_check``: the widest width at two rates for all ``steps``, the check of a short or transferred fit.
* ``fit_rates``: each width's rate under :attr:`~dalign_repro.sweep.family.SweepConfig.lr_fit` (``each_width`` or
  ``transfer``, which falls back to every width where its check fails).
* :func:`lr_check`: that check, read back from the ``<family>_lr`` table.
"""

from __future__ import annotations

import logging
import math
import shutil
from typing import Any

import pandas as pd
import torch

from dalign_repro.training import distributed
from dalign_repro.sweep.family import SweepConfig, take
from dalign_repro.sweep.plan import check_jobs, job_grid, trial_name
from dalign_repro.sweep.trained import train_run, train_config_for

__all__ = ["lr_check", "fit_rates"]

log = logging.getLogger(__name__)


def _rate_trial(config, family, splits, pools, width, lr, device, group=None, trial=True) -> dict | None:
    """Train the first seed at rate ``lr`` and score it on the validation pool: one row of ``<family>_lr``.

    ``trial=False`` trains at full length (the full-length check of the fit). In a job group only the
    group's first rank scores it (the others return None).
    """
    model, result, failure = train_run(config, family, splits, width, config.seed, lr, device, group, trial)
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
                shutil.rmtree(train_config_for(config, family, width, config.seed, row["lr"], trial=True).checkpoint_dir,
                              ignore_errors=True)


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
        rows = [lookup(trial_name(width, lr)) for lr in grids[width]]
        if all(row is not None for row in rows):
            _prune_candidates(config, family, width, _choose_rate(rows, grids[width]))

    for extension in range(config.lr_extend + 1):
        trials, _ = job_grid(config, group_sizes, training, costs, grids)
        trial_rows = distributed.run_jobs(
            folder, trials, lambda job, group: _rate_trial(config, family, splits, pools, *job.payload, device, group),
            finished=width_fitted)
        lr_rows = {width: _choose_rate([trial_rows[trial_name(width, lr)] for lr in grids[width]], grids[width])
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
    checks = check_jobs(config, group_sizes, training, rates)
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


def fit_rates(config, family, splits, pools, device, folder, group_sizes, training):
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
