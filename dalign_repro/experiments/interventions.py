"""Residual interventions on the width sweeps' trained models: does μ_Mᵀg_K predict the change on fresh data?

For each family (LLaMA, Pythia, ResNet-20) this takes the models its width sweep
trained (the first ``runs_per_width`` trained seeds of every width, loaded from the
sweep's checkpoints) and inserts, at an insertion point, the two zero-initialized
residual parameters of :mod:`dalign_repro.studies.interventions.compute`: a bias shared over positions
and a zero-output block. Each step is sized by the first-order decrease δ of the M
training examples' own loss (``η = δ / ‖G_M‖²``), so one grid of δ serves every
family, width and layer. Two studies, one table (``interventions``):

* **sign** (``study = "sign"``): ``resamples`` draws of (M, K) examples per budget, at
  the primary and the last insertion point, one step of each δ in ``sign_steps``
  (1e-3 to 1e-1 nats: steps that change the loss far above float32 roundoff) and, on the
  first ``optimizer_resamples`` draws at the primary insertion point, ``optimizer_steps``
  steps of gradient descent that train the inserted parameter alone on the M examples
  (``optimizer_decrease`` per step). Every step is measured on the K examples that formed
  g_K (``observed``: first order there is Taylor's theorem, the same-sample check) and on
  the evaluation set E (``eval_observed``, ``eval_n``): the sweep's evaluation examples
  (:attr:`dalign_repro.sweep.pools.Pools.evaluation`, at most ``eval_examples`` of them), test
  examples disjoint from the held-out pool the K (and, in ``heldout/heldout``, the M)
  examples come from, and from the train split. In the ``train/heldout`` setting the M
  examples come from the sweep's train pool (the question a growth method faces); in
  ``heldout/heldout`` both come from the held-out pool, disjoint (one law: the setting the
  certificates cover). Draws are seeded by (setting, budget, resample) alone, so every
  width and layer sees the same examples: a paired comparison. ``bias_alignment`` is the
  shared-bias statistic of the same draw, beside the block's own. A float32 change on E
  within roundoff is recomputed in float64 (``eval_float64``); one still within roundoff
  is a tie (``eval_tie``), left out of the sign statistics and counted.
* **retention** (``study = "retention"``): ``retention_draws`` draws of
  ``retention_budget`` examples at the primary insertion point, δ over the log grid
  ``retention_steps``, the model in float64 so that the smallest steps are not lost in
  roundoff. ``second_order`` is the exact curvature term ``½ η² uᵀH_K u`` along the step.
  The paper reads retention on steps that predict a decrease: the report keeps the draws
  with ``μ_Mᵀg_K > 0`` only. On K that curve is Taylor's theorem (the same-sample check).
  With ``retention_on_evaluation`` every retention step is also measured on E (the float64
  model, so a step of δ = 1e-6 is not lost in roundoff): the first-order prediction made
  from g_K (``predicted``) or from μ_M (``−δ``) against ``ΔL_E``, retention out of sample.
  ``retention_step_fractions`` adds steps stated against training: δ a fraction of the
  first-order decrease one optimizer step of the trained model (its own optimizer at its
  peak rate ``lr``) would bring the inserted parameter
  (:func:`dalign_repro.studies.interventions.compute.optimizer_step_decrease`), ``step_fraction`` in the table.

Run without Jupyter: ``python -m dalign_repro.experiments.interventions --profile cpu``.
A family whose sweep has not run at the profile is run first (that is the long part:
see its chapter); its checkpoints are reused when present, else its runs are trained
again, deterministically.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from dalign_core.seeding import derived_seed, deterministic_algorithms
from dalign_core.device import resolve_device
from dalign_repro.config import ExperimentConfig, default_results_dir, measurement_only
from dalign_repro.experiments import llama_width, pythia_width, resnet_width
from dalign_repro.experiments._models import (TrainedModel, check_families, chosen_runs, count_by_family,
                                             earlier_results, in_regime, remove_model_jobs, run_model_jobs,
                                             sweeps_changed, trained_models)
from dalign_repro.experiments._runner import Experiment, register, run_experiment
from dalign_repro.families import family
from dalign_repro.sweep.family import Family, SweepConfig, count, take
from dalign_repro.studies.interventions.compute import KINDS, optimizer_step_decrease, train_decrease_draws
from dalign_repro.sweep.trained import trained_model

__all__ = ["Config", "Source", "SOURCES", "TABLES", "run", "SETTINGS", "model_rows", "evaluation_set"]

log = logging.getLogger("dalign")

TABLES = ("interventions",)
SETTINGS = ("train/heldout", "heldout/heldout")


@dataclass(frozen=True)
class Source:
    """Where a family's trained models come from: its width-sweep experiment."""

    config: Callable[[str], Any]
    """profile → the sweep experiment's config."""
    run: Callable[..., Path]
    """``run(config, out_dir=...)``: writes (or finds current) the sweep's tables."""
    family: Callable[[SweepConfig], Family]
    """A sweep config → the family that trained its models."""
    sweeps: Callable[[Any], list[SweepConfig]] = lambda config: [config]
    """The sibling sweeps of one experiment config (depth regimes, data sets)."""
    tables: str | None = None
    """The prefix of the sweep's tables (``<tables>_runs`` ...; None: the family's key in the study)."""

    def runs_table(self, name: str) -> str:
        """The name of the sweep's runs table when the study calls the family ``name``."""
        return f"{self.tables or name}_runs"


SOURCES: dict[str, Source] = {
    "llama": Source(llama_width.Config.for_profile, llama_width.run, lambda c: family("llama", c)),
    "pythia": Source(pythia_width.Config.for_profile, pythia_width.run, lambda c: family("pythia", c),
                     lambda c: c.sweeps()),
    "resnet": Source(resnet_width.Config.for_profile, resnet_width.run,
                     lambda c: family("resnet", c), lambda c: c.sweeps()),
}


@dataclass(frozen=True)
class Config(ExperimentConfig):
    """The intervention study (defaults: the ``cpu`` profile)."""

    profile: str = "cpu"
    seed: int = 0
    families: tuple[str, ...] = ("llama", "pythia", "resnet")
    runs_per_width: int = 1
    """Trained seeds per width that are intervened on (the first ones)."""
    retention_budget: tuple[int, int] = (32, 32)
    """(M, K) of the retention study's draws."""
    retention_draws: int = 8
    """Draws of the retention study per model (only those with μ_Mᵀg_K > 0 are read), where
    ``retention_draws_by_family`` does not say otherwise."""
    retention_draws_by_family: tuple[tuple[str, int], ...] = ()
    """(family, retention draws per model) for the families whose out-of-sample verdict needs more draws than
    ``retention_draws`` gives: the verdict reads the draws that predict a decrease, at least 30 per family."""
    retention_steps: tuple[float, ...] = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1)
    """First-order train-loss decreases δ (nats) of the retention grid."""
    budgets: tuple[tuple[int, int], ...] = ((16, 16),)
    """(M, K) of the sign study; M + K stays small against the pools (512 to 1024 examples)."""
    resamples: int = 8
    """Draws per (model, layer, setting, budget) in the sign study. Each draw costs 6 loss evaluations over E (3 δ ×
    2 kinds), the study's main cost: 8 give 128 to 192 draws per family at cpu (a Wilson interval of about ±0.07 at
    a share of 0.9); the LLaMA N=256 model took 35 min on one core (2026-12-02)."""
    sign_steps: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    """δ (nats) of the sign study's single steps: changes far above float32 roundoff (about 1e-7 nats)."""
    sign_step: float = 1e-3
    """The δ the sign claim is judged at (one of ``sign_steps``): the smallest, where first order still holds."""
    optimizer_steps: tuple[int, ...] = (10, 100)
    """Counts of gradient-descent steps on the inserted parameter alone after which the change is read."""
    optimizer_decrease: float = 1e-2
    """δ of each optimizer step's η (its first step lowers the M examples' loss by this much at first order)."""
    optimizer_resamples: int = 4
    """Draws per (model, setting, budget) at the primary insertion point that also take the optimizer steps (each
    costs 2 × 100 gradient steps on the M examples and 4 loss evaluations over E)."""
    eval_examples: int | None = None
    """At most this many of the sweep's evaluation examples form E (None: all of them)."""
    retention_on_evaluation: bool = measurement_only(False, neutral=False)
    """Measure the retention steps on E too (out-of-sample retention): a float64 pass over E per step, kind and
    draw (``retention_eval_steps`` chooses the grid's steps so measured)."""
    retention_step_fractions: tuple[float, ...] = measurement_only((), neutral=())
    """Fractions of one optimizer step of the trained model at which the retention study also steps."""
    retention_eval_steps: tuple[float, ...] | None = measurement_only(None, neutral=None)
    """The δ of ``retention_steps`` whose steps are also measured on E (None: every one). Out of sample the
    first-order prediction's ratio to ΔL_E does not depend on δ while first order holds, so a few δ (one where it
    holds, the steps stated against training) answer the question at a fraction of the float64 passes over E."""
    retention_eval_kinds: tuple[str, ...] | None = measurement_only(None, neutral=None)
    """The kinds (``bias``, ``block``) whose retention steps are also measured on E (None: both). The out-of-sample
    verdict reads the shared bias, the statistic the paper's certificate is about."""
    hidden: int | None = None
    """Width of the zero-output block (None: the insertion point's width)."""
    confidence: float = 0.95
    device: str = "auto"

    def __post_init__(self):
        super().__post_init__()  # the checks every config shares (seed, NaN, device, ...)
        check_families(self.families, SOURCES, "retention_draws_by_family", self.retention_draws_by_family)
        if self.runs_per_width < 1 or self.resamples < 1 or self.retention_draws < 1:
            raise ValueError("runs_per_width, resamples and retention_draws must be at least 1")
        if self.sign_step not in self.sign_steps:
            raise ValueError(f"sign_step {self.sign_step} must be one of sign_steps {self.sign_steps}")
        if any(n < 1 for n in self.optimizer_steps) or self.optimizer_resamples < 0:
            raise ValueError(f"optimizer_steps {self.optimizer_steps} must be positive counts and "
                             f"optimizer_resamples {self.optimizer_resamples} not negative")
        if self.retention_eval_steps is not None and not set(self.retention_eval_steps) <= set(self.retention_steps):
            raise ValueError(f"retention_eval_steps {self.retention_eval_steps} must be among retention_steps "
                             f"{self.retention_steps} (or None: every one)")
        if self.retention_eval_kinds is not None and not set(self.retention_eval_kinds) <= set(KINDS):
            raise ValueError(f"retention_eval_kinds {self.retention_eval_kinds} must be among {KINDS} (or None: both)")
        if any(not f > 0 for f in self.retention_step_fractions):
            raise ValueError(f"retention_step_fractions {self.retention_step_fractions} must be positive fractions "
                             "of one optimizer step")
        if self.eval_examples is not None and self.eval_examples < 1:
            raise ValueError(f"eval_examples {self.eval_examples} must be positive or None")

    def retention_draws_of(self, family: str) -> int:
        """Retention draws per model in ``family`` (``retention_draws_by_family``, else ``retention_draws``)."""
        return count_by_family(self.retention_draws_by_family, family, self.retention_draws)


def _draw(setting: str, n_train: int, n_heldout: int, M: int, K: int, key) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Indices of M examples (into the train or held-out pool) and K held-out ones, disjoint in one pool."""
    g = torch.Generator().manual_seed(derived_seed("interventions", *key))
    heldout = torch.randperm(n_heldout, generator=g)
    if setting == "heldout/heldout":
        return heldout[K:K + M], heldout[:K], "heldout"
    return torch.randperm(n_train, generator=g)[:M], heldout[:K], "train"


def _rows(steps, base: dict, **extra) -> list[dict]:
    bias_alignment = next((s.alignment for s in steps if s.kind == "bias"), float("nan"))
    return [{**base, **extra, "kind": s.kind, "train_decrease": s.train_decrease, "optimizer_steps": s.optimizer_steps,
             "eta": s.eta, "predicted": s.predicted, "observed": s.observed, "retention": s.retention,
             "second_order": s.second_order, "alignment": s.alignment, "bias_alignment": bias_alignment,
             "eval_observed": s.eval_observed, "eval_predicted": s.eval_predicted, "eval_n": s.eval_n,
             "eval_float64": s.eval_float64, "eval_tie": s.eval_tie, "step_fraction": s.step_fraction}
            for s in steps]


def model_rows(config: Config, sweep_config: SweepConfig, family: Family, model, pools: dict, base: dict
               ) -> list[dict]:
    """Both studies on one trained model; ``pools`` holds its sweep's ``train`` and ``heldout`` pool examples and
    the ``evaluation`` examples E (disjoint from both: the caller's guarantee, checked by :func:`evaluation_set`)."""
    points = family.insertion_points(sweep_config, model)
    primary = family.primary_layer(sweep_config)
    layers = [primary] + [points[-1]] * (points[-1] != primary)
    batches = lambda examples: family.batches(examples, sweep_config.capture_batch)  # noqa: E731
    n_train, n_heldout = count(pools["train"]), count(pools["heldout"])
    block_seed = derived_seed("interventions-block", config.seed)
    evaluation = batches(pools["evaluation"])
    rows = []

    def draws(setting, M, K, resamples, *key):
        for r in resamples:
            train_idx, heldout_idx, source = _draw(setting, n_train, n_heldout, M, K, (config.seed, *key, r))
            yield batches(take(pools[source], train_idx)), batches(take(pools["heldout"], heldout_idx))

    M, K = config.retention_budget
    optimizer = family.train_settings(sweep_config).get("optimizer", "adamw")
    retained = train_decrease_draws(copy.deepcopy(model).double(), primary,
                                    draws("train/heldout", M, K, range(config.retention_draws_of(base["family"])),
                                          "retention"),
                                    config.retention_steps, hidden=config.hidden, seed=block_seed,
                                    eval_batches=evaluation if config.retention_on_evaluation else None,
                                    step_fractions=config.retention_step_fractions,
                                    eval_decreases=config.retention_eval_steps,
                                    eval_kinds=config.retention_eval_kinds,
                                    step_scale=optimizer_step_decrease(optimizer, float(base["lr"])))
    for r, steps in enumerate(retained):
        rows += _rows(steps, base, study="retention", setting="train/heldout", layer=primary, M=M, K=K, resample=r)

    for layer in layers:
        for setting in SETTINGS:
            for M, K in config.budgets:
                n_opt = min(config.optimizer_resamples, config.resamples) if layer == primary else 0
                common = dict(hidden=config.hidden, seed=block_seed, curvature=False, eval_batches=evaluation)
                # The first n_opt draws also take the optimizer steps; every draw takes the single steps.
                trained = train_decrease_draws(model, layer, draws(setting, M, K, range(n_opt), setting, M, K),
                                               config.sign_steps, optimizer_steps=config.optimizer_steps,
                                               optimizer_decrease=config.optimizer_decrease, **common)
                plain = train_decrease_draws(model, layer, draws(setting, M, K, range(n_opt, config.resamples),
                                                                 setting, M, K), config.sign_steps, **common)
                for r, steps in enumerate(trained):
                    rows += _rows(steps, base, study="sign", setting=setting, layer=layer, M=M, K=K, resample=r)
                for r, steps in enumerate(plain, start=n_opt):
                    rows += _rows(steps, base, study="sign", setting=setting, layer=layer, M=M, K=K, resample=r)
    return rows


def evaluation_set(splits, pools, limit: int | None) -> tuple[Any, torch.Tensor]:
    """E: the sweep's evaluation examples (the first ``limit``), test-split indices disjoint from the held-out pool.

    Raises ``RuntimeError`` if E shares an example with the held-out pool (the M and K examples are drawn from that
    pool and from the train split, so E disjoint from it is disjoint from every draw)."""
    index = pools.evaluation[:limit] if limit is not None else pools.evaluation
    shared = set(index.tolist()) & set(pools.heldout.tolist())
    if shared:
        raise RuntimeError(f"the evaluation set shares {len(shared)} examples with the held-out pool")
    return take(splits.test, index), index


def _left_out(config: Config, name: str, experiment_config, runs: pd.DataFrame) -> list[dict]:
    """The failed runs left out where they would have been used: below the last seed their width took."""
    source, left = SOURCES[name], []
    for sweep_config in source.sweeps(experiment_config):
        columns = source.family(sweep_config).columns(sweep_config)
        last = chosen_runs(runs, columns, config.runs_per_width).groupby("width").seed.max()
        mine = in_regime(runs, columns).sort_values(["width", "seed"])
        failed = mine[~mine.trained_ok.astype(bool)]
        left += [dict(family=name, **columns, model=r.model, width=int(r.width), seed=int(r.seed),
                      left_out=f"failed run: {r.failure}")
                 for r in failed[failed.seed < failed.width.map(last).fillna(float("inf"))].itertuples()]
    return left


def _models(config: Config, out_dir: Path) -> tuple[list[TrainedModel], dict]:
    """Every model the studies run on, and the provenance of each family (filled with the models' facts later)."""
    models, provenance = [], {}
    for name in config.families:
        source = SOURCES[name]
        experiment_config = source.config(config.profile)  # its sweep ran in run(), on every rank
        runs = pd.read_csv(out_dir / f"{source.runs_table(name)}.csv")
        mine = trained_models(name, experiment_config, source.sweeps, source.family, runs, config.runs_per_width)
        sets = {tuple(m.family.columns(m.sweep_config).items()): m for m in mine}
        provenance[name] = {
            "sweep_models_hash": experiment_config.models_hash(), "models": [],
            "left_out": _left_out(config, name, experiment_config, runs),
            "evaluation": {"source": "the sweep's evaluation examples (Pools.evaluation), test split",
                           "disjoint_from": "the held-out pool (K, and M in heldout/heldout) and the train split",
                           "sets": [{**dict(regime), "of": int(len(m.pools.evaluation)),
                                     "examples": int(len(evaluation_set(m.splits, m.pools, config.eval_examples)[1]))}
                                    for regime, m in sets.items()]}}
        models += mine
    return models, provenance


def compute(config: Config, out_dir: Path,
            reuse: bool = True) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The study's tables and provenance; ``reuse``: take the rows of models whose sweep is unchanged from the
    existing table (:func:`~dalign_repro.experiments._models.earlier_results`)."""
    deterministic_algorithms()
    device = resolve_device(config.device)
    out_dir = Path(out_dir)
    models, provenance = _models(config, out_dir)

    def work(m: TrainedModel) -> dict:
        started = time.perf_counter()
        evaluation, _ = evaluation_set(m.splits, m.pools, config.eval_examples)
        examples = {"train": take(m.splits.train, m.pools.train), "heldout": take(m.splits.test, m.pools.heldout),
                    "evaluation": evaluation}
        model = trained_model(m.sweep_config, m.family, m.splits, m.base["width"], m.base["seed"], m.base["lr"],
                              device)
        rows = model_rows(config, m.sweep_config, m.family, model, examples, m.base)
        seconds = round(time.perf_counter() - started, 1)
        log.info("interventions: %s done in %.0f s", m.job.name, seconds)
        return {"rows": rows, "facts": {**m.base, "seconds": seconds}}

    earlier = earlier_results("interventions", "interventions", config, out_dir, models) if reuse else {}
    results = run_model_jobs("interventions", config, out_dir, models, work, earlier)
    if results is None:  # a rank other than 0 under torchrun: its share is done, rank 0 writes the table
        return {}, {}
    rows = []
    for m in models:  # in the order of the families, regimes, widths and seeds, whatever order the workers took
        rows += results[m.job.name]["rows"]
        provenance[m.family_name]["models"].append(results[m.job.name]["facts"])
    for facts in provenance.values():
        facts["models"] += facts.pop("left_out")
    return {"interventions": pd.DataFrame(rows)}, {"families": provenance, "device": str(device)}


def run(config: Config, out_dir: str | Path | None = None, force: bool = False) -> Path:
    """Run both studies on every family's trained models (skipped when current, unless ``force``)."""
    out_dir = Path(out_dir) if out_dir is not None else default_results_dir(config.profile)
    # The sweeps first, on every rank: under torchrun they share their jobs over the ranks, and so do the models
    # of this study (one job per model; rank 0 writes the table).
    for name in config.families:
        source = SOURCES[name]
        source.run(source.config(config.profile), out_dir=out_dir)  # skipped when its tables are current
    written = run_experiment("interventions", TABLES, config, lambda c, out: compute(c, out, reuse=not force),
                             out_dir=out_dir, force=force or sweeps_changed("interventions", config, out_dir, SOURCES), sharded=True)
    remove_model_jobs("interventions", config, out_dir)  # the tables hold every model's rows now
    return written


EXPERIMENT = register(Experiment("interventions", Config, TABLES, runner=run, sharded=True, description=__doc__))

if __name__ == "__main__":
    EXPERIMENT.main()
