"""The width sweeps' trained models as jobs: what the intervention and growth studies run on.

Both studies take, from each family's sweep at the profile, the first ``per_width`` trained
seeds of every width, load each from the sweep's checkpoints, and compute one model's rows
at a time. :func:`trained_models` chooses them; :func:`run_model_jobs` runs one job per model
on the machine's workers and keeps each finished model's rows in
``<out>/partial/<experiment>-<config hash>/`` until the experiment's tables are written, so
an interrupted study resumes where it stopped (a job's name carries its sweep's config hash:
a job of a changed sweep is never reused).

A model's rows depend only on the study's config, its sweep's models (the sweep's config but
the fields that change only what the sweep measures: ``models_hash``) and the model, so
when one family's sweep models change, :func:`earlier_results` takes the other families' rows
and facts from the study's existing table and provenance instead of computing them again
(each such model's facts say ``reused_from``: when and at which commit its rows were
computed). A study's ``force`` recomputes every model.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from dalign_repro.config import ExperimentConfig
from dalign_repro.training.distributed import Job, context, remove_jobs, run_jobs
from dalign_repro.sweep.family import Family, SweepConfig
from dalign_repro.sweep.pools import prepare
from dalign_repro.sweep.trained import train_config_for

__all__ = ["TrainedModel", "count_by_family", "check_families", "check_counts_by_family", "in_regime", "chosen_runs",
           "checkpoints_present", "trained_models", "jobs_folder", "recorded_sweep_hash", "sweep_changed",
           "earlier_results", "run_model_jobs", "remove_model_jobs"]

log = logging.getLogger(__name__)


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
    sweep_hash: str
    """The models hash of the family's sweep experiment (:meth:`~dalign_repro.config.ExperimentConfig.models_hash`:
    its config but the fields that change only what the sweep measures), which a study's provenance records per
    family as ``sweep_models_hash``."""


def count_by_family(counts: tuple[tuple[str, int], ...], family: str, default: int) -> int:
    """The count ``counts`` pairs with ``family`` (``(family, count)`` pairs), else ``default``."""
    return dict(counts).get(family, default)


def check_families(families: tuple[str, ...], sources, field: str, counts: tuple[tuple[str, int], ...]) -> None:
    """Raise ``ValueError`` unless ``families`` is a non-empty selection of ``sources`` (a study's families) and the
    study's per-family counts ``counts`` (config field ``field``) are valid (:func:`check_counts_by_family`)."""
    unknown = sorted(set(families) - set(sources))
    if unknown or not families:
        raise ValueError(f"families {families} must be a non-empty selection of {sorted(sources)}")
    check_counts_by_family(field, counts, sources)


def check_counts_by_family(field: str, counts: tuple[tuple[str, int], ...], families) -> None:
    """Raise ``ValueError`` unless every ``(family, count)`` pair names one of ``families`` with a count of at
    least 1."""
    if any(name not in families or n < 1 for name, n in counts):
        raise ValueError(f"{field} {counts} must pair families of {sorted(families)} with counts of at least 1")


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
    folder = Path(train_config_for(sweep_config, family, width, seed, lr).checkpoint_dir)
    return folder.is_dir() and any(folder.iterdir())


def trained_models(name: str, experiment_config: Any, sweeps: Callable[[Any], list[SweepConfig]],
                   family_of: Callable[[SweepConfig], Family], runs: pd.DataFrame, per_width: int,
                   failed_runs: bool = False) -> list[TrainedModel]:
    """The models a study runs on, of family ``name`` (sweep config ``experiment_config``, runs table ``runs``).

    Each job's name says family, regime, model, seed and the sweep's config hash; its cost is the width (it
    balances the workers' plan only)."""
    sweep_hash = experiment_config.models_hash()
    models = []
    for sweep_config in sweeps(experiment_config):
        family = family_of(sweep_config)
        columns = family.columns(sweep_config)
        splits, _, pools = prepare(sweep_config, family)
        for run in chosen_runs(runs, columns, per_width, failed_runs).itertuples():
            base = dict(family=name, **columns, model=run.model, width=int(run.width), seed=int(run.seed),
                        lr=float(run.lr), heldout_loss=float(run.heldout_loss))
            job_name = "_".join(str(v) for v in (name, *columns.values(), run.model, f"seed{run.seed}",
                                                 sweep_hash[:8]))
            models.append(TrainedModel(name, sweep_config, family, splits, pools, base,
                                       Job(job_name, cost=float(run.width)), sweep_hash))
    return models


def jobs_folder(experiment: str, config: ExperimentConfig, out_dir: str | Path) -> Path:
    """Where a study keeps each finished model's rows until its tables are written."""
    return Path(out_dir) / "partial" / f"{experiment}-{config.config_hash()}"


def recorded_sweep_hash(family_facts: dict) -> str | None:
    """The sweep models hash a study's provenance records for one family (``sweep_models_hash``; provenance
    written before measurement-only fields existed has ``sweep_config_hash``, which equals it there)."""
    return family_facts.get("sweep_models_hash", family_facts.get("sweep_config_hash"))


def sweep_changed(experiment: str, name: str, family_facts: dict, experiment_config: ExperimentConfig) -> bool:
    """Whether family ``name``'s sweep models differ from those a study's existing table was computed on (logged)."""
    changed = recorded_sweep_hash(family_facts) != experiment_config.models_hash()
    if changed:
        log.info("%s: the %s sweep's models changed since the table was computed; recomputing", experiment, name)
    return changed


def sweeps_changed(experiment: str, config: ExperimentConfig, out_dir: str | Path, sources: dict[str, Any]) -> bool:
    """Whether the existing ``<out>/<experiment>.json`` table was computed on other sweep models than the families of
    ``config`` have now, or recorded a family as "not run" whose sweep has results now (then: recompute).

    ``sources``: family name → its source (``.config(profile)``, ``.runs_table(name)``), as the studies keep them."""
    from dalign_repro.report.results import results_current

    path = Path(out_dir) / f"{experiment}.json"
    if not path.is_file():
        return False
    families = json.loads(path.read_text()).get("families", {})
    for name in config.families:
        used = families.get(name, {})
        experiment_config = sources[name].config(config.profile)
        if sweep_changed(experiment, name, used, experiment_config):
            return True
        if used.get("status") == "not run" and results_current(out_dir, (sources[name].runs_table(name),),
                                                                experiment_config):
            log.info("%s: the %s sweep has results now; recomputing", experiment, name)
            return True
    return False


def earlier_results(experiment: str, table: str, config: ExperimentConfig, out_dir: str | Path,
                    models: list[TrainedModel]) -> dict[str, dict]:
    """Job name → ``{"rows": …, "facts": …}`` of each model whose rows the study's existing table already holds.

    A model qualifies when the table (``<out>/<table>.csv`` with ``<out>/<experiment>.json``) was computed with
    this study config (same config hash) and the model's family with the same sweep models (same
    :func:`recorded_sweep_hash`), and the table and provenance hold its rows and its facts. pandas reads floats back
    exactly, so the table written again is the same (a test checks it byte for byte).
    """
    out_dir = Path(out_dir)
    csv, provenance_path = out_dir / f"{table}.csv", out_dir / f"{experiment}.json"
    if not (csv.is_file() and provenance_path.is_file()):
        return {}
    provenance = json.loads(provenance_path.read_text())
    if provenance.get("config_hash") != config.config_hash():
        return {}
    families = provenance.get("families", {})
    candidates = [m for m in models if recorded_sweep_hash(families.get(m.family_name, {})) == m.sweep_hash]
    if not candidates:
        return {}
    earlier = pd.read_csv(csv)
    found = {}
    for m in candidates:
        identity = {key: m.base[key] for key in ("family", *m.family.columns(m.sweep_config), "model", "seed")}
        rows = earlier
        for key, value in identity.items():
            rows = rows[rows[key] == value] if key in rows else rows.iloc[0:0]
        facts = [f for f in families[m.family_name].get("models", [])
                 if "left_out" not in f and all(f.get(key) == value for key, value in identity.items())]
        if len(rows) and len(facts) == 1:
            reused_from = facts[0].get("reused_from") or {"commit": provenance.get("git", {}).get("commit"),
                                                          "written_utc": provenance.get("written_utc")}
            found[m.job.name] = {"rows": [{key: _plain(value) for key, value in row.items()}
                                          for row in rows.to_dict("records")],
                                 "facts": {**facts[0], "reused_from": reused_from}}
    return found


def _plain(value: Any) -> Any:
    """A table cell as the JSON value a job would have kept (numpy scalars to Python)."""
    return value.item() if hasattr(value, "item") else value


def run_model_jobs(experiment: str, config: ExperimentConfig, out_dir: str | Path, models: list[TrainedModel],
                   work: Callable[[TrainedModel], dict], earlier: dict[str, dict] | None = None
                   ) -> dict[str, dict] | None:
    """``work(model)`` for every model (a JSON-able dict), on the machine's workers, each kept as it finishes;
    job name → result. Models already finished in the jobs folder are reused, not recomputed, and so are those
    in ``earlier`` (:func:`earlier_results`).

    Under torchrun every rank calls this with the same models and the ranks share them, one model per job, through
    the jobs folder (as the sweeps share theirs): rank 0 returns every result once all are in, the other ranks
    return None when their share is done (their study has no table to write)."""
    by_name = {model.job.name: model for model in models}
    if len(by_name) != len(models):
        raise RuntimeError("two models of a study share a job name")
    earlier = {name: result for name, result in (earlier or {}).items() if name in by_name}
    if earlier:
        log.info("%s: %d of %d models' rows taken from the existing table (their sweeps are unchanged)",
                 experiment, len(earlier), len(models))
    todo_models = [m for m in models if m.job.name not in earlier]
    for family in {m.family.name: m.family for m in todo_models}.values():
        family.import_modules()  # once here, not in every worker run_jobs forks (nothing when all rows are reused)
    todo = [m.job for m in todo_models]
    computed = run_jobs(jobs_folder(experiment, config, out_dir), todo,
                        lambda job, _group: work(by_name[job.name]), collect="main") if todo else {}
    if not context().is_main:
        return None
    return {**earlier, **computed}


def remove_model_jobs(experiment: str, config: ExperimentConfig, out_dir: str | Path) -> None:
    """Remove the study's jobs folder once its tables are written (by rank 0: under torchrun the other ranks
    return at once, while rank 0 may still be computing into the folder)."""
    if context().is_main:
        remove_jobs(jobs_folder(experiment, config, out_dir))
