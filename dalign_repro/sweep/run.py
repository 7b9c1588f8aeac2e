"""The width sweep: the steps every model family shares, written once.

For each width N of a :class:`~dalign_repro.sweep.family.SweepConfig`, with a
:class:`~dalign_repro.sweep.family.Family` answering the family-specific questions:

1. **A learning rate that fits the width** (:mod:`~dalign_repro.sweep.rates`). Train the first
   seed at every rate of the width's grid (``lr_candidates``, moved with width by ``lr_width_exponent``) and keep
   the one with the lowest loss on the *validation* split (whole documents that are
   neither a q pool nor the test text). One rate for all widths would compare a
   well-tuned narrow model with a badly tuned wide one. Under ``lr_fit='transfer'``
   (μTransfer) only the narrowest width is fitted; its rate is carried to every width
   by the grid's rule and checked at full length at the widest width against its grid
   neighbour; if the neighbour wins, every width is fitted after all.
2. **Seeds.** Train the other seeds at that rate (the first seed's run is reused).
3. **Geometry along training** (:mod:`~dalign_repro.sweep.measure`). At every analysis
   checkpoint: the held-out loss on ``eval_examples`` test examples, and q at every insertion point on two pools drawn
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
5. **Trends** (``<family>_trend``, :func:`trend_table`): the slope of log d_align on log
   width with a t interval over runs (:mod:`dalign_repro.sweep.trend`) over each run's late
   window, at every checkpoint ("matched steps") and at matched held-out loss (each run
   where it reaches a common loss level), and of logit p̂ on log width per budget.

A run that diverges, or whose final held-out loss does not beat the family's
baseline, is marked ``trained_ok = False``: reported as failed, never part of a trend.
Before anything trains, the data is checked to supply every pool (:mod:`~dalign_repro.sweep.pools`), and a run of many
epochs over its split warns (the epoch count goes into the provenance).

The work is a grid of independent jobs — each (width, rate) trial of step 1, then each
measured (width, seed) run of steps 2-4 (:mod:`~dalign_repro.sweep.plan`) — kept one file each in a jobs folder as they
finish (:func:`~dalign_repro.sweep.plan.jobs_dir`), so a rerun computes only what is missing. Under ``torchrun``
the ranks share that grid (:mod:`dalign_repro.training.distributed`): the trials first; then every
rank reads the chosen rates from the shared folder and the measured runs follow; rank 0
merges the tables. The widest widths may train on several ranks at once (data parallel,
``DALIGN_RANKS_PER_JOB``). A plain process is a world of one and runs the same grid.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from dalign_core.seeding import deterministic_algorithms
from dalign_repro.training import distributed
from dalign_repro.sweep.family import Family, SweepConfig, take
from dalign_repro.sweep.measure import measure_trained, misalignment_rows, measure_redundancy
from dalign_repro.sweep.plan import job_grid, jobs_dir
from dalign_repro.sweep.pools import prepare
from dalign_repro.sweep.rates import fit_rates, lr_check
from dalign_repro.sweep.trained import train_run
from dalign_repro.sweep import trend

__all__ = ["SWEEP_TABLES", "tables_of", "run_sweep", "run_sweeps", "trend_table", "trained_only"]

log = logging.getLogger(__name__)

SWEEP_TABLES = ("lr", "runs", "geometry", "misalignment", "redundancy", "trend")
"""Tables every sweep writes, as ``<family>_<name>.csv``."""

GPU_PROFILES = ("gpu", "paper")
"""Profiles whose models are sized for a GPU: a sweep refuses to start them on a CPU unless asked explicitly."""


def tables_of(family: Family) -> tuple[str, ...]:
    """The result table names a family's sweep writes: ``("llama_lr", "llama_runs", ...)``."""
    return tuple(f"{family.name}_{name}" for name in SWEEP_TABLES + family.extra_tables)


def trained_only(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs that trained (an empty table stays empty)."""
    return table[table.trained_ok.astype(bool)] if "trained_ok" in table else table


TREND_KEYS = ["quantity", "view", "reduction", "layer", "pool", "setting", "M", "K", "step", "loss_level", "judged"]
"""What tells trend rows apart; :data:`dalign_repro.sweep.trend.SLOPE_COLUMNS` follow them."""


def trend_table(config: SweepConfig, geometry: pd.DataFrame, misalignment: pd.DataFrame,
                primary: str | None = None, judged_reduction: str = "shared") -> pd.DataFrame:
    """Slope tests of width trends (:mod:`dalign_repro.sweep.trend`): one row per (quantity, view, group).

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
    model, result, failure = train_run(config, family, splits, width, seed, lr, device, group)
    if group is not None and torch.distributed.get_rank(group) != 0:
        return None
    base = dict(family=family.name, model=family.model_name(config, width), width=width, seed=seed, lr=lr,
                parameters=sum(p.numel() for p in model.parameters()), baseline_loss=baseline)
    if result is None:
        log.warning("%s N=%d seed=%d: training diverged (%s)", family.name, width, seed, failure)
        return {"runs": [{**base, "heldout_loss": math.nan, "final_train_loss": math.nan, "trained_ok": False,
                          "failure": failure}]}
    # trained_ok is known only after the final evaluation; measure, then stamp it on every row.
    geometry_rows, final, heldout_loss, quality = measure_trained(config, family, model, result, splits, pools,
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
        for row in measure_redundancy(config, family, model, heldout, config.redundancy_examples, device, seed)]
    rows = {"geometry": geometry_rows, "redundancy": redundancy,
            "misalignment": misalignment_rows(config, final, run, family.primary_layer(config), family.reductions[0]),
            **family.extra_rows(config, model, heldout, run)}
    seconds = time.perf_counter() - started
    log.info("%s N=%d seed=%d lr=%g: held-out loss %.3f (baseline %.3f) %s; %.0f s", family.name, width, seed, lr,
             heldout_loss, baseline, "ok" if trained_ok else "FAILED", seconds)
    return {**rows, "runs": [{**run, "seconds": round(seconds, 1)}]}


def run_sweep(config: SweepConfig, family: Family, jobs: str | Path | None = None, ranks_per_job: str | None = None,
              keep_jobs: bool = False) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Run the whole sweep; returns (tables by name, provenance extras). See the module docstring.

    With ``jobs`` (see :func:`~dalign_repro.sweep.plan.jobs_dir`), every finished job — a (width, rate) trial of
    the rate fit, a measured (width, seed) run — is kept there as it finishes, so a rerun
    of the same config after an interruption computes only what is missing and gives the
    same tables as an uninterrupted run. The folder is removed once the tables are built
    (``keep_jobs``: left for the caller, who removes it once the tables are safe).

    Under ``torchrun`` the ranks share these jobs (:mod:`dalign_repro.training.distributed`): the
    rate trials first, then — every rank reading the chosen rates from ``jobs``, which must
    be on a filesystem they share — the measured runs; rank 0 returns the tables, the
    other ranks ``({}, {})``. ``ranks_per_job`` (or ``$DALIGN_RANKS_PER_JOB``, see
    :func:`dalign_repro.training.distributed.ranks_per_job`) trains the widest models on several
    ranks together.
    """
    deterministic_algorithms()
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
    family.import_modules()  # once here, not in every worker its job grids fork
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
    chosen, lr_rows = fit_rates(config, family, splits, pools, device, folder, group_sizes, training)
    _, runs = job_grid(config, group_sizes, training, measuring)

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


