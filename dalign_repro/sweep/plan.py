"""The sweep's grid of jobs: the (width, rate) trials of the rate fit, its full-length check, the measured
(width, seed) runs, and what each costs, for :mod:`dalign_repro.training.distributed` to share among ranks.

* :func:`jobs_dir`: where finished jobs wait until the tables are written.
* ``job_grid``, ``check_jobs``, ``planned_checks``: the jobs and their relative costs.
* :func:`trainings`: full trainings each width costs, from that grid (for the dry run's projection).
"""

from __future__ import annotations

from pathlib import Path

from dalign_repro.training import distributed
from dalign_repro.sweep.family import Family, SweepConfig

__all__ = ["jobs_dir", "trainings", "job_grid", "check_jobs", "planned_checks", "trial_name"]


def jobs_dir(out_dir: str | Path, config: SweepConfig, family: Family) -> Path:
    """Where a sweep keeps each finished job's rows until its tables are written: ``<out>/partial/<family>-<hash>``."""
    return Path(out_dir) / "partial" / f"{family.name}-{config.config_hash()}"


def trial_name(width: int, lr: float) -> str:
    """The job name of the rate trial of ``width`` at rate ``lr`` (its rows are looked up by it)."""
    return f"lr_N{width}_lr{lr:g}"


def job_grid(config: SweepConfig, group_sizes: dict[int, int], training: dict[int, float],
              measuring: dict[int, float], grids: dict[int, tuple[float, ...]] | None = None) -> tuple[list, list]:
    """The sweep's jobs: the (width, rate) trials of the rate fit, then the measured (width, seed) runs.

    ``training`` and ``measuring``: the cost of one full training and of measuring one trained
    run at each width (any unit); ``grids``: the rates to try, by width (default: the grid of each of
    :attr:`SweepConfig.fitted_widths`). Where trials run at full length, the first seed's measured run
    reuses the chosen trial's training, so it is a measurement on one rank; so does the widest width's
    where the full-length check (:func:`check_jobs`) trained it.
    """
    grids = grids or {width: config.lr_grid(width) for width in config.fitted_widths}
    short = config.trial_steps < config.steps
    fraction = config.trial_steps / config.steps

    def reused(width: int, seed: int) -> bool:
        return seed == config.seed and ((not short and width in config.fitted_widths)
                                        or (config.full_check and width == max(config.widths)))

    trials = [distributed.Job(trial_name(width, lr), cost=training[width] * fraction, ranks=group_sizes[width],
                              payload=(width, lr)) for width in grids for lr in grids[width]]
    runs = [distributed.Job(f"N{width}_seed{seed}", payload=(width, seed),
                            cost=measuring[width] + (0.0 if reused(width, seed) else training[width]),
                            ranks=1 if reused(width, seed) else group_sizes[width])
            for width in config.widths for seed in range(config.seed, config.seed + config.seeds)]
    return trials, runs


def check_jobs(config: SweepConfig, group_sizes: dict[int, int], training: dict[int, float],
                rates: list[float]) -> list:
    """The full-length check of the rate fit: the widest width trained at ``rates`` (two of them)."""
    width = max(config.widths)
    return [distributed.Job(f"full_N{width}_lr{lr:g}", cost=training[width], ranks=group_sizes[width],
                            payload=(width, lr)) for lr in rates]


def planned_checks(config: SweepConfig, group_sizes: dict[int, int], training: dict[int, float]) -> list:
    """The full-length check's jobs as a plan counts them before any rate is known (their cost is not the rates')."""
    if not config.full_check:
        return []
    return check_jobs(config, group_sizes, training, list(config.lr_grid(max(config.widths))[:2]))


def trainings(config: SweepConfig) -> dict[int, float]:
    """Full trainings each width costs (trials at their fraction of ``steps``), from the sweep's own job grid:
    the rate trials, the seeds whose training no trial or check made, and the widest width's full-length check.
    Grid extensions and a failed transfer (:attr:`SweepConfig.lr_fit`) are not counted: they depend on results."""
    ones, zeros = {w: 1.0 for w in config.widths}, {w: 0.0 for w in config.widths}
    trials, runs = job_grid(config, {w: 1 for w in config.widths}, ones, zeros)
    checks = planned_checks(config, {w: 1 for w in config.widths}, ones)
    return {width: sum(job.cost for job in trials + runs + checks if job.payload[0] == width)
            for width in config.widths}
