"""The width sweeps' trained models as jobs: what the intervention and growth studies run on.

Both studies take, from each family's sweep at the profile, the first ``per_width`` trained
seeds of every width, load each from the sweep's checkpoints, and compute one model's rows
at a time. :func:`trained_models` chooses them; :func:`run_model_jobs` runs one job per model
on the machine's workers and keeps each finished model's rows in
``<out>/partial/<experiment>-<config hash>/`` until the experiment's tables are written, so
an interrupted study resumes where it stopped (a job's name carries its sweep's config hash:
a job of a changed sweep is never reused).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from dalign_core.config import ExperimentConfig
from dalign_core.distributed import Job, context, remove_jobs, run_jobs
from dalign_core.family import Family, SweepConfig
from dalign_core.sweep import _train_config, prepare

__all__ = ["TrainedModel", "in_regime", "chosen_runs", "checkpoints_present", "trained_models", "jobs_folder",
           "run_model_jobs", "remove_model_jobs"]


@dataclass
class TrainedModel:
    """One trained model of a sweep, as a study sees it before loading it."""

    family_name: str
    sweep_config: SweepConfig
    family: Family
    splits: Any
    pools: Any
    base: dict
    """The study's leading columns: family, the regime columns, model, width, seed, lr, heldout_loss."""
    job: Job


def in_regime(runs: pd.DataFrame, columns: dict) -> pd.DataFrame:
    """The rows of ``runs`` of one sweep: those whose regime ``columns`` (a depth, a data set) match."""
    for column, value in columns.items():
        runs = runs[runs[column] == value]
    return runs


def chosen_runs(runs: pd.DataFrame, columns: dict, per_width: int, failed_runs: bool = False) -> pd.DataFrame:
    """The first ``per_width`` seeds of every width in the regime ``columns`` (only trained ones unless
    ``failed_runs``), ordered by width and seed."""
    mine = in_regime(runs, columns)
    if not failed_runs:
        mine = mine[mine.trained_ok.astype(bool)]
    return mine.sort_values(["width", "seed"]).groupby("width").head(per_width)


def checkpoints_present(sweep_config: SweepConfig, family: Family, width: int, seed: int, lr: float) -> bool:
    """Whether the sweep's checkpoints of this run are still on disk (a study loads them, it never trains again)."""
    folder = Path(_train_config(sweep_config, family, width, seed, lr).checkpoint_dir)
    return folder.is_dir() and any(folder.iterdir())


def trained_models(name: str, experiment_config: Any, sweeps: Callable[[Any], list[SweepConfig]],
                   family_of: Callable[[SweepConfig], Family], runs: pd.DataFrame, per_width: int,
                   failed_runs: bool = False) -> list[TrainedModel]:
    """The models a study runs on, of family ``name`` (sweep config ``experiment_config``, runs table ``runs``).

    Each job's name says family, regime, model, seed and the sweep's config hash; its cost is the width (it
    balances the workers' plan only)."""
    sweep_hash = experiment_config.config_hash()[:8]
    models = []
    for sweep_config in sweeps(experiment_config):
        family = family_of(sweep_config)
        columns = family.columns(sweep_config)
        splits, _, pools = prepare(sweep_config, family)
        for run in chosen_runs(runs, columns, per_width, failed_runs).itertuples():
            base = dict(family=name, **columns, model=run.model, width=int(run.width), seed=int(run.seed),
                        lr=float(run.lr), heldout_loss=float(run.heldout_loss))
            job_name = "_".join(str(v) for v in (name, *columns.values(), run.model, f"seed{run.seed}", sweep_hash))
            models.append(TrainedModel(name, sweep_config, family, splits, pools, base,
                                       Job(job_name, cost=float(run.width))))
    return models


def jobs_folder(experiment: str, config: ExperimentConfig, out_dir: str | Path) -> Path:
    """Where a study keeps each finished model's rows until its tables are written."""
    return Path(out_dir) / "partial" / f"{experiment}-{config.config_hash()}"


def run_model_jobs(experiment: str, config: ExperimentConfig, out_dir: str | Path, models: list[TrainedModel],
                   work: Callable[[TrainedModel], dict]) -> dict[str, dict]:
    """``work(model)`` for every model (a JSON-able dict), on the machine's workers, each kept as it finishes;
    job name → result. Models already finished in the jobs folder are reused, not recomputed.

    A study runs on rank 0 alone under torchrun (:mod:`dalign_core.experiments._runner`), so its jobs are local."""
    by_name = {model.job.name: model for model in models}
    if len(by_name) != len(models):
        raise RuntimeError("two models of a study share a job name")
    return run_jobs(jobs_folder(experiment, config, out_dir), [m.job for m in models],
                    lambda job, _group: work(by_name[job.name]), local=True)


def remove_model_jobs(experiment: str, config: ExperimentConfig, out_dir: str | Path) -> None:
    """Remove the study's jobs folder once its tables are written (by rank 0: under torchrun the other ranks
    return at once, while rank 0 may still be computing into the folder)."""
    if context().is_main:
        remove_jobs(jobs_folder(experiment, config, out_dir))
