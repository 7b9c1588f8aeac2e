"""Where to grow: do d_align and B_align rank the insertion points of a trained model by the held-out gain?

For each family (LLaMA at depth 4, Pythia at both depths, ResNet-20) this takes the models
its sweep trained (:data:`SOURCES`: the width sweeps', LLaMA's from
:mod:`dalign_repro.experiments.llama_depth`; the first ``runs_per_width`` trained seeds of
every width, ``runs_by_family`` where a family needs more models; loaded from the sweep's
checkpoints) and, at every insertion point (each block output; at most
``max_points`` of them, evenly spaced, first and last included):

1. reads the predictors of :func:`dalign_repro.studies.growth.predictors` before growing: d_align,
   d_∥, d_2 and ‖μ‖² of the family's judged q on ``examples`` held-out pool examples;
   μ_Mᵀg_K and B_align at the budgets ``budgets``; the norm of the zero-output block's
   gradient on as many train-pool examples; a random ranking;
2. grows there (:func:`dalign_repro.studies.growth.grow`): a zero-output residual block, only its
   parameters trained with Adam for ``steps`` steps (read after each budget), at the rate of
   ``rates`` with the largest validation gain at the model's middle point, ``repeats``
   times (W₁ and the batches drawn anew, the same draws at every point: paired);
3. records the realized gain (the loss on ``eval_examples`` of the sweep's evaluation pool,
   disjoint from the q pool, before minus after) with a t interval over the repeats.

One table, ``growth``: one row per (model, insertion point, budget_steps). The chapter
(``notebooks/08_growth.ipynb``) scores the rankings with :func:`dalign_repro.studies.growth.score`
and judges the claim with :func:`dalign_repro.studies.growth.verdict`.

A family whose sweep has no current results at the profile is reported ``not run`` in
the provenance (its sweep is the long part: see its chapter), except where
``run_sweeps`` is set (smoke and lab: seconds), which runs it first. A model whose
checkpoints are gone is likewise left out, not trained again.

Run without Jupyter: ``python -m dalign_repro.experiments.growth --profile cpu``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dalign_repro.studies import growth
from dalign_core.seeding import derived_seed, deterministic_algorithms
from dalign_core.device import resolve_device
from dalign_repro.config import ExperimentConfig, default_results_dir
from dalign_repro.experiments._models import (TrainedModel, check_families, checkpoints_present,
                                             count_by_family, earlier_results, remove_model_jobs, run_model_jobs,
                                             sweeps_changed, trained_models)
from dalign_repro.experiments._runner import Experiment, register, run_experiment
from dalign_repro.experiments import llama_depth
from dalign_repro.experiments.interventions import SOURCES as SWEEP_SOURCES
from dalign_repro.experiments.interventions import Source
from dalign_repro.families import family
from dalign_repro.sweep.family import Family, SweepConfig, count, take
from dalign_repro.report.results import results_current
from dalign_repro.sweep.trained import trained_model

__all__ = ["Config", "SOURCES", "TABLES", "COLUMNS", "run", "compute", "model_rows", "choose_points", "sweep_status"]

log = logging.getLogger("dalign")

TABLES = ("growth",)

SOURCES: dict[str, Source] = {
    **SWEEP_SOURCES,
    "llama": Source(llama_depth.Config.for_profile, llama_depth.run, lambda c: family("llama_depth", c),
                    tables="llama_depth"),
}
"""Where each family's grown models come from: the width sweeps' (:data:`~dalign_repro.experiments.interventions.
SOURCES`) but LLaMA's, whose width sweep has two decoder layers; a ranking needs at least four insertion points
(:data:`dalign_repro.studies.growth.MIN_POINTS`), so LLaMA's models come from :mod:`~dalign_repro.experiments.
llama_depth` (depth 4)."""


@dataclass(frozen=True)
class Config(ExperimentConfig):
    """The growth study (defaults: the ``cpu`` profile: about an hour on 2 cores, see the README's timings)."""

    profile: str = "cpu"
    seed: int = 0
    families: tuple[str, ...] = ("llama", "pythia", "resnet")
    runs_per_width: int = 2
    """Trained seeds per width that are grown (the first ones), where ``runs_by_family`` does not say otherwise."""
    runs_by_family: tuple[tuple[str, int], ...] = (("llama", 3), ("resnet", 3))
    """(family, seeds per width) for the families whose decision needs more models than ``runs_per_width`` gives:
    simulated at 10 repeats (:func:`dalign_repro.studies.growth.simulate_decision`), a strong effect is reproduced
    95% of the time by 12 models of 4 points, 35% by 6; 67% by 8 models of 6 points (Pythia's 12: 98%)."""
    run_sweeps: bool = False
    """Run a family's sweep first where its results are missing (False: report the family "not run")."""
    failed_runs: bool = False
    """Grow also the runs that did not beat their baseline (smoke and lab, whose few steps train no model that
    does: there the point is to exercise the code)."""
    max_points: int | None = 6
    """Insertion points per model, evenly spaced with the first and last (None: every block output)."""
    examples: int = 256
    """Held-out pool examples of the geometry, and train pool examples of the block gradient and μ_M."""
    budgets: tuple[int, ...] = (16, 64)
    """M = K of μ_Mᵀg_K and B_align."""
    steps: tuple[int, ...] = (20, 100)
    """Adam steps of the inserted block after which the gain is read (one run per repeat, read along the way)."""
    batch_size: int = 8
    """Training examples per step of the inserted block."""
    rates: tuple[float, ...] = (3e-3, 1e-2)
    """Adam rates tried at each model's middle point; the largest validation gain after the longest budget wins."""
    repeats: int = 10
    """Growth runs per point (W₁ and batches drawn anew); the gain's interval is a t interval over them. At 2 (the
    design before) one point's standard error matched the spread of the gains across points (median ratio about 1);
    a pilot on a depth-4 LLaMA model (N = 32, 6 repeats) read ratios of 2.2, 2.0, 0.5 and 1.5 after 20, 100, 300 and
    1,000 steps: a longer budget does not spread the points further, more repeats shrink the error as 1/√R."""
    eval_examples: int = 256
    """Examples of the sweep's evaluation pool (and of its validation pool, for the rate) that score a gain."""
    hidden: int | None = None
    """Width of the inserted block (None: the insertion point's width)."""
    confidence: float = 0.95
    device: str = "auto"

    def __post_init__(self):
        super().__post_init__()  # the checks every config shares (seed, NaN, device, ...)
        check_families(self.families, SOURCES, "runs_by_family", self.runs_by_family)
        if self.runs_per_width < 1 or self.repeats < 1 or self.batch_size < 1:
            raise ValueError("runs_per_width, repeats and batch_size must be at least 1")
        if not self.steps or min(self.steps) < 1 or not self.rates or min(self.rates) <= 0:
            raise ValueError(f"steps {self.steps} must be positive step counts and rates {self.rates} positive")
        if not self.budgets or min(self.budgets) < 2 or max(self.budgets) > self.examples:
            raise ValueError(f"budgets {self.budgets} must lie in [2, examples={self.examples}]")
        if self.max_points is not None and self.max_points < 2:
            raise ValueError("max_points must be at least 2 (a ranking needs two points) or None")

    def runs_of(self, family: str) -> int:
        """Trained seeds per width grown in ``family`` (``runs_by_family``, else ``runs_per_width``)."""
        return count_by_family(self.runs_by_family, family, self.runs_per_width)


COLUMNS = ["family", "model", "width", "seed", "layer"]
"""The leading columns of the table; then the predictors (:func:`dalign_repro.studies.growth.predictor_names`), then
``budget_steps, gain, gain_lo, gain_hi`` and the rest (layer_index, lr, repeats, loss_before, d_align_lo, ...)."""


def choose_points(points: list[str], most: int | None) -> list[str]:
    """At most ``most`` of ``points``, evenly spaced, the first and the last always among them."""
    if most is None or len(points) <= most:
        return list(points)
    index = sorted({round(i * (len(points) - 1) / (most - 1)) for i in range(most)})
    return [points[i] for i in index]


def model_rows(config: Config, sweep_config: SweepConfig, family: Family, model, splits, pools, base: dict
               ) -> tuple[list[dict], dict]:
    """The growth rows of one trained model, and what its provenance records (the rate chosen, the seconds)."""
    points = choose_points(family.insertion_points(sweep_config, model), config.max_points)
    batches = lambda examples: family.batches(examples, sweep_config.capture_batch)  # noqa: E731
    first = lambda index, n: index[:min(n, len(index))]  # noqa: E731
    heldout = batches(take(splits.test, first(pools.heldout, config.examples)))
    train = batches(take(splits.train, first(pools.train, config.examples)))
    evaluation = batches(take(splits.test, first(pools.evaluation, config.eval_examples)))
    validation = batches(take(splits.validation, first(pools.validation, config.eval_examples)))
    n_train = count(splits.train)
    make = lambda index: family.batches(take(splits.train, index), config.batch_size)[0]  # noqa: E731
    block_seed = lambda r: derived_seed("growth-block", config.seed, r)  # noqa: E731
    model_key = (config.seed, base["family"], base["model"], base["seed"], base.get("dataset", ""))
    measured = growth.predictors(model, points, heldout, train, reduction=family.reductions[0],
                                 budgets=config.budgets, hidden=config.hidden, block_seed=block_seed(0),
                                 confidence=config.confidence, random_key=model_key)
    longest = max(config.steps)
    middle = points[len(points) // 2]
    trials = {}
    for lr in config.rates:
        stream = growth.seeded_batches(make, n_train, config.batch_size, (config.seed, "rate"))
        trials[lr] = growth.grow(model, middle, stream, validation, [longest], lr=lr, hidden=config.hidden,
                                 seed=block_seed(0))["gain"][longest]
    lr = max(config.rates, key=lambda r: (trials[r] if math.isfinite(trials[r]) else -math.inf, -r))
    rows = []
    for index, layer in enumerate(points):
        runs = [growth.grow(model, layer, growth.seeded_batches(make, n_train, config.batch_size,
                                                                (config.seed, "repeat", r)),
                            evaluation, config.steps, lr=lr, hidden=config.hidden, seed=block_seed(r))
                for r in range(config.repeats)]
        stats_ = measured[layer]
        for steps in sorted(config.steps):
            gain, lo, hi = growth.t_interval([run["gain"][steps] for run in runs], config.confidence)
            row = {**base, "layer": layer, **stats_.values, "budget_steps": steps, "gain": gain, "gain_lo": lo,
                   "gain_hi": hi, "layer_index": family.insertion_points(sweep_config, model).index(layer),
                   "lr": lr, "repeats": config.repeats, "loss_before": runs[0]["before"],
                   "reduction": family.reductions[0]}
            for name in ("d_align", "grad_norm"):
                row[f"{name}_lo"], row[f"{name}_hi"] = stats_.intervals[name]
            rows.append(row)
    return rows, {"lr": lr, "rate_trials": {f"{r:g}": trials[r] for r in config.rates}, "middle": middle,
                  "points": points}


def sweep_status(config: Config, name: str, out_dir: Path) -> tuple[Any, str]:
    """``(sweep experiment config, "")`` where the family's sweep results are current at the profile, else the
    reason it is not run (after running the sweep first where ``run_sweeps`` is set)."""
    source = SOURCES[name]
    experiment_config = source.config(config.profile)
    if config.run_sweeps:
        source.run(experiment_config, out_dir=out_dir)  # skipped when its tables are current
        return experiment_config, ""
    if not results_current(out_dir, (source.runs_table(name),), experiment_config):
        return experiment_config, (f"the {name} sweep has no current results in {out_dir} at profile "
                                   f"{config.profile!r}; run python -m {type(experiment_config).__module__} --profile "
                                   f"{config.profile} first")
    return experiment_config, ""


def compute(config: Config, out_dir: Path,
            reuse: bool = True) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The study's tables and provenance; ``reuse``: take the rows of models whose sweep is unchanged from the
    existing table (:func:`~dalign_repro.experiments._models.earlier_results`)."""
    deterministic_algorithms()
    device = resolve_device(config.device)
    out_dir = Path(out_dir)
    provenance: dict[str, Any] = {}
    candidates: list[TrainedModel] = []
    for name in config.families:
        experiment_config, reason = sweep_status(config, name, out_dir)
        facts: dict[str, Any] = {"sweep_models_hash": experiment_config.models_hash()}
        provenance[name] = facts
        if reason:
            facts.update(status="not run", reason=reason)
            log.info("growth: %s not run: %s", name, reason)
            continue
        facts.update(status="run", models=[])
        source = SOURCES[name]
        runs = pd.read_csv(out_dir / f"{source.runs_table(name)}.csv")
        candidates += trained_models(name, experiment_config, source.sweeps, source.family, runs,
                                     config.runs_of(name), failed_runs=config.failed_runs)

    # A model whose rows the existing table holds needs no checkpoint; one that must be grown needs its checkpoints
    # (or run_sweeps, which trains it again).
    earlier = earlier_results("growth", "growth", config, out_dir, candidates) if reuse else {}
    models: list[TrainedModel] = []
    for m in candidates:
        present = checkpoints_present(m.sweep_config, m.family, m.base["width"], m.base["seed"], m.base["lr"])
        if config.run_sweeps or present or m.job.name in earlier:
            models.append(m)
        else:
            provenance[m.family_name]["models"].append({**m.base, "left_out": "checkpoints gone (not trained again)"})

    def work(m: TrainedModel) -> dict:
        started = time.perf_counter()
        model = trained_model(m.sweep_config, m.family, m.splits, m.base["width"], m.base["seed"], m.base["lr"],
                              device)
        rows, facts = model_rows(config, m.sweep_config, m.family, model, m.splits, m.pools, m.base)
        seconds = round(time.perf_counter() - started, 1)
        log.info("growth: %s done in %.0f s", m.job.name, seconds)
        return {"rows": rows, "facts": {**m.base, **facts, "sweep_lr": m.base["lr"], "seconds": seconds}}

    results = run_model_jobs("growth", config, out_dir, models, work, earlier) if models else {}
    if results is None:  # a rank other than 0 under torchrun: its share is done, rank 0 writes the table
        return {}, {}
    rows = []
    for m in models:
        rows += results[m.job.name]["rows"]
        provenance[m.family_name]["models"].append(results[m.job.name]["facts"])
    table = pd.DataFrame(rows)
    if len(table):
        names = growth.predictor_names(config.budgets)
        ordered = COLUMNS + names + ["budget_steps", "gain", "gain_lo", "gain_hi"]
        table = table[ordered + [c for c in table.columns if c not in ordered]]
    else:
        table = pd.DataFrame(columns=COLUMNS + growth.predictor_names(config.budgets) +
                             ["budget_steps", "gain", "gain_lo", "gain_hi"])
    return {"growth": table}, {"families": provenance, "device": str(device)}


def run(config: Config, out_dir: str | Path | None = None, force: bool = False) -> Path:
    """Grow every family's trained models at every insertion point (skipped when current, unless ``force``)."""
    out_dir = Path(out_dir) if out_dir is not None else default_results_dir(config.profile)
    written = run_experiment("growth", TABLES, config, lambda c, out: compute(c, out, reuse=not force),
                             out_dir=out_dir, force=force or sweeps_changed("growth", config, out_dir, SOURCES), sharded=True)
    remove_model_jobs("growth", config, out_dir)  # the table holds every model's rows now
    return written


EXPERIMENT = register(Experiment("growth", Config, TABLES, runner=run, sharded=True, description=__doc__))

if __name__ == "__main__":
    EXPERIMENT.main()
