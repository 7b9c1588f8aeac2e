"""What a model family tells the width sweep: a small spec, the rest is shared.

The LLaMA, Pythia and ResNet chapters (and the interventions that reuse their
models) all run the same experiment: for each width, fit a learning rate, train a
few seeds with checkpoints, and at each checkpoint capture q at the insertion points
on random pools. Only a few answers differ per family, and they live in a
:class:`Family`, one registered spec per family in :mod:`dalign_repro.families`
(the sweep takes the spec as an argument and never looks a family up, nor imports
an experiment):

==================  =====================================================================
``load_data``       train / validation / test splits (verified, from a manifest)
``build``           a freshly initialized model at a width and seed
``insertion_points`` the dotted module names whose outputs are captured
``primary_layer``   the fixed insertion point of the misalignment study
``batches``         what :func:`dalign_core.capture.hooks.accumulate_geometry` takes
``heldout_metric``  loss on held-out examples (lower is better)
``baseline``        the held-out loss a trained model must beat (else: a failed run)
==================  =====================================================================

and, where the default does not fit:

==================  =====================================================================
``train_loss``      the training loss of a batch (default: a causal LM's next-token loss)
``model_name``      the name of a run's model in the tables (default: ``<name>-N<width>``)
``train_settings``  optimizer and schedule (default AdamW with cosine decay)
``evaluate``        the held-out loss and other held-out metrics from one pass (default: the loss alone)
``failure``         the rule for a failed run (default: the loss does not beat the baseline)
``columns``         columns every row carries (the depth regime, the data set; default none)
``extra_rows``      family-only measurements at the final checkpoint (default none)
``for_config``      the spec that trains a given config (default: the spec itself)
``modules``         what ``build`` imports, imported before the job grids fork (default none)
==================  =====================================================================

:class:`SweepConfig` holds the fields every family shares (widths, seeds, steps,
learning-rate candidates, pools, budgets); a family's config subclasses it and adds
its own (depth, context, data set). ``tests/test_sweep.py`` adds a toy family — an
MLP on synthetic data — in a few dozen lines.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from dalign_repro.config import ExperimentConfig, added_field, measurement_only, require, require_at_least, require_items
from dalign_repro.training.evaluation import lm_loss

__all__ = ["SweepConfig", "Splits", "Family", "take", "count"]


LR_FITS = ("each_width", "transfer")
"""The ways a sweep fits its learning rates (:attr:`SweepConfig.lr_fit`)."""

AT_LEAST = dict(seeds=1, steps=1, batch_size=1, capture_batch=1, eval_examples=4, validation_examples=1,
                resamples=1, warmup_steps=0, resume_points=0, lr_extend=0, redundancy_examples=0,
                # fields a family's config adds (checked where they exist): model shape and data
                depth=1, deep_depth=1, head_dim=1, width_scale=1, context=2, vocab_size=2, insertion_layer=0,
                validation_images=1)
"""The smallest value of each whole-number field a sweep config may hold (checked at construction, so a bad
``--set`` is one line naming the field, never a traceback from deep inside a run). ``eval_examples`` needs 4 for
the evaluation pool's U-statistics; a family's config may hold only some of these fields."""


@dataclass(frozen=True)
class SweepConfig(ExperimentConfig):
    """The fields every width sweep shares (a family's ``Config`` subclasses this and sets the profiles)."""

    profile: str = "cpu"
    seed: int = 0
    """Base seed: run r of a width uses seed ``seed + r``; the pools are drawn from ``seed`` too."""
    seeds: int = 3
    widths: tuple[int, ...] = ()
    steps: int = 600
    batch_size: int = 16
    lr_candidates: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    """Peak learning rates tried at the narrowest width; each width keeps the one with the lowest validation loss."""
    lr_fit: str = added_field("each_width", neutral="each_width")
    """How each width gets its rate. ``each_width``: every width tries its own grid. ``transfer`` (μTransfer): only
    the narrowest width tries its grid; the rate it keeps is carried to every width by the grid's own rule,
    ``(min(widths) / N) ** lr_width_exponent``, and checked once, at the widest width, by training the carried rate
    and its grid neighbour on the side of the narrowest width's runner-up at full length. The carried rate must win
    on validation loss; if the neighbour wins, the transfer has failed and every width is fitted as under
    ``each_width`` (:func:`dalign_repro.sweep.rates.lr_check` reports which happened). With one width or one candidate
    rate there is nothing to carry: both fits are the same."""
    lr_trial_fraction: float = 1.0
    """Rate trials train for this fraction of ``steps`` (their own warmup and decay, no analysis checkpoints).
    Below 1 (under ``each_width``) the chosen rate is checked at the widest width against its runner-up at full
    length."""
    lr_extend: int = 2
    """A width whose best rate is at the edge of its grid tries one more rate past that edge, up to this many
    times, so the chosen rate ends inside the rates tried."""
    lr_width_exponent: float = 0.0
    """The grid moves with width as ``(widths[0] / N) ** lr_width_exponent``: 1 centres it on the muP rule for
    Adam (the best rate falls as 1/N), so a fixed number of candidates brackets every width's best rate."""
    warmup_steps: int = 60
    weight_decay: float = 0.1
    checkpoint_steps: tuple[int, ...] = (0, 100, 400, 500, 600)
    """Analysis checkpoints (0 = at initialization); dense in the last third, where each run's late window is
    averaged (at least 8 there for a width claim: one checkpoint's d_align scatters by a factor of 3)."""
    all_layer_steps: tuple[int, ...] | None = None
    """Checkpoints at which every insertion point is captured; the others capture the primary layer only
    (None: every checkpoint captures every layer)."""
    resume_points: int = 4
    """Resume points per run (each also saves the optimizer state); fewer saves less time on large models."""
    train_pool_steps: tuple[int, ...] | None = None
    """Checkpoints at which the train pool is also captured (None: all of them)."""
    pool_size: int = 1024
    """Examples per q pool, drawn at random without replacement (train pool from train, held-out from test)."""
    checkpoint_pool_size: int | None = measurement_only(None, neutral=None)
    """Examples of each q pool captured at the analysis checkpoints before the last (None, or a size of at least
    ``pool_size``: the whole pool): the next block of the pool's random order at each successive checkpoint
    (:func:`dalign_repro.sweep.measure.checkpoint_pool`), so a run's late window sees the whole pool across its checkpoints.
    The final checkpoint always captures the whole pool (the reported d_align and the misalignment study). A run's
    late-window mean averages 9 checkpoints whose scatter around it (an SD of about 1 in log d_align for LLaMA at
    cpu) dwarfs one checkpoint's estimation error (0.19 at 1,024 examples, about 0.37 at 256), so a quarter of the
    pool costs a quarter of the capture and little of the power. Measure that premise before setting the field: it
    fails for Pythia's per-position q, whose d_align barely moves between checkpoints
    (:attr:`dalign_repro.experiments.pythia_width.Config.checkpoint_pool_size`)."""
    eval_examples: int = 512
    """Held-out examples scored for the held-out loss, disjoint from the held-out q pool."""
    validation_examples: int = 512
    """Validation examples that choose the learning rate (neither a q pool nor the test text)."""
    capture_batch: int = 64
    budgets: tuple[tuple[int, int], ...] = ((4, 4), (16, 16), (32, 32), (64, 64), (128, 128))
    """(M, K) budgets of the misalignment study; M + K <= pool_size / 4 keeps the means nearly independent."""
    judged_budget: tuple[int, int] | None = None
    """The (M, K) at which the misalignment width claim is judged (None: the middle budget)."""
    run_sd: float | None = None
    """The expected SD of a run's late-window mean of log d_align within a width, measured on earlier runs of
    this design: the noise behind the power calculation that sets ``seeds`` (:meth:`power_plan`)."""
    redundancy_examples: int = 256
    """Held-out pool examples on which each run's final q is checked for redundancy with trained parameters'
    gradients (:mod:`dalign_core.capture.redundancy`); 0 skips the check."""
    resamples: int = 20_000
    confidence: float = 0.95
    matched_loss_offsets: tuple[float, ...] = (0.0, 0.1, 0.25)
    """Matched-loss levels, in nats above the highest final loss any run reaches."""
    prune_candidates: bool = False
    """Delete the checkpoints of the rates a width did not keep, once it has chosen (large models: saves disk;
    a rerun after an interruption then trains those candidates again)."""
    max_epochs: float = 4.0
    """Warn when training makes more passes than this over its split."""
    device: str = "auto"
    autocast_dtype: str | None = None

    SHARED_TRAINING_FIELDS: ClassVar[tuple[str, ...]] = (
        "steps", "batch_size", "warmup_steps", "weight_decay", "checkpoint_steps", "autocast_dtype")
    """Shared fields that determine the trained weights (with width, seed, rate and the family's own)."""

    def __post_init__(self):
        super().__post_init__()
        if not self.widths:
            raise ValueError("widths is empty: give at least one width")
        require_items(self, "widths", 1)
        require_at_least(self, AT_LEAST)
        require_items(self, "budgets", 1, pairs=True)
        largest = max(number for pair in self.budgets for number in pair)
        require(self, "pool_size", isinstance(self.pool_size, int) and self.pool_size >= max(4, largest),
                f"it must be at least 4 and at least the largest M or K of the budgets ({largest}): each budget "
                "draws M examples from the train pool and K from the held-out pool")
        require(self, "redundancy_examples", self.redundancy_examples == 0 or self.redundancy_examples >= 4,
                "it must be 0 (skip the check) or at least 4 (the held-out fit needs them)")
        require(self, "confidence", 0 < self.confidence < 1, "it must lie strictly between 0 and 1")
        require(self, "weight_decay", self.weight_decay >= 0, "it must be at least 0")
        require(self, "warmup_steps", self.warmup_steps <= self.steps, f"it must be at most steps={self.steps}")
        require(self, "max_epochs", self.max_epochs > 0, "it must be a positive number of passes")
        require(self, "run_sd", self.run_sd is None or self.run_sd > 0,
                "it must be a positive standard deviation (of a run summary within a width), or none")
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        if not self.lr_candidates or min(self.lr_candidates) <= 0:
            raise ValueError(f"lr_candidates must be positive learning rates, got {self.lr_candidates}")
        if self.steps not in self.checkpoint_steps:
            raise ValueError(f"checkpoint_steps {self.checkpoint_steps} must include the final step {self.steps}")
        outside = [s for s in self.checkpoint_steps if not 0 <= s <= self.steps]
        if outside:
            raise ValueError(f"checkpoint_steps {outside} are outside [0, steps={self.steps}]")
        if self.train_pool_steps is not None and self.steps not in self.train_pool_steps:
            raise ValueError(f"train_pool_steps {self.train_pool_steps} must include the final step {self.steps}")
        if self.all_layer_steps is not None and not set(self.all_layer_steps) <= set(self.checkpoint_steps):
            raise ValueError(f"all_layer_steps {self.all_layer_steps} must be among checkpoint_steps "
                             f"{self.checkpoint_steps}")
        if self.checkpoint_pool_size is not None and self.checkpoint_pool_size < 2:
            raise ValueError(f"checkpoint_pool_size {self.checkpoint_pool_size} must be at least 2 (or None: the "
                             "whole pool at every checkpoint)")
        if self.lr_fit not in LR_FITS:
            raise ValueError(f"lr_fit {self.lr_fit!r} is not one of {LR_FITS}: 'each_width' fits every width's grid, "
                             "'transfer' fits the narrowest width and carries its rate by the grid's rule")
        if not 0 < self.lr_trial_fraction <= 1:
            raise ValueError(f"lr_trial_fraction must be in (0, 1], got {self.lr_trial_fraction}")
        if self.judged_budget is not None and tuple(self.judged_budget) not in {tuple(b) for b in self.budgets}:
            raise ValueError(f"judged_budget {self.judged_budget} is not one of the budgets {self.budgets}")

    def scaled_rate(self, lr: float, width: int) -> float:
        """A rate of the narrowest width moved to ``width`` by the grid's rule (3 significant digits)."""
        return float(f"{lr * (min(self.widths) / width) ** self.lr_width_exponent:.3g}")

    def lr_grid(self, width: int) -> tuple[float, ...]:
        """The candidate learning rates at ``width`` (3 significant digits), ascending."""
        return tuple(sorted(self.scaled_rate(lr, width) for lr in self.lr_candidates))

    @property
    def transfers_rate(self) -> bool:
        """Whether the rate is fitted at the narrowest width and carried (``lr_fit='transfer'``, with several widths
        and several candidate rates: with one of either there is nothing to carry or to check it against)."""
        return self.lr_fit == "transfer" and len(self.widths) > 1 and len(self.lr_candidates) > 1

    @property
    def fitted_widths(self) -> tuple[int, ...]:
        """The widths whose grids the rate trials try: the narrowest where the rate is carried, else all."""
        return (min(self.widths),) if self.transfers_rate else tuple(self.widths)

    @property
    def full_check(self) -> bool:
        """Whether the widest width's rate is checked at full length: where it was carried, or with short trials."""
        return self.transfers_rate or self.trial_steps < self.steps

    @property
    def trial_steps(self) -> int:
        """Training steps of a rate trial (``lr_trial_fraction`` of ``steps``)."""
        return max(round(self.steps * self.lr_trial_fraction), 1)

    @property
    def budget_judged(self) -> tuple[int, int]:
        """The (M, K) of the misalignment width claim: ``judged_budget``, or the middle budget."""
        return tuple(self.judged_budget or sorted(self.budgets, key=sum)[len(self.budgets) // 2])

    def layer_steps(self, step: int) -> bool:
        """Whether every insertion point is captured at checkpoint ``step`` (else the primary layer only)."""
        return self.all_layer_steps is None or step in self.all_layer_steps

    def power_plan(self) -> dict[str, float]:
        """The design's power for the paper's slope, from ``run_sd``: seeds, SE, detectable slope, seeds needed.

        Empty where ``run_sd`` is not set, or where the design has fewer than two widths (a single width has no
        slope on log width to size: the sweep still trains and measures it, and its verdicts read "not run"). See
        :mod:`dalign_repro.sweep.trend`.
        """
        from dalign_repro.sweep import trend

        if self.run_sd is None or len(set(self.widths)) < 2:
            return {}
        se, df = trend.design_se(self.run_sd, self.widths, self.seeds)
        return dict(run_sd=self.run_sd, seeds=self.seeds, widths=len(self.widths), se=se,
                    detectable=trend.detectable_slope(se, df, self.confidence),
                    power=trend.power(trend.PAPER_SLOPE, se, df, self.confidence),
                    seeds_needed=trend.seeds_for_power(self.run_sd, self.widths, confidence=self.confidence),
                    late_checkpoints=len(self.last_third))

    @property
    def train_pool_checkpoints(self) -> tuple[int, ...]:
        """The checkpoints at which the train pool is captured (``train_pool_steps``, or all of them)."""
        return self.checkpoint_steps if self.train_pool_steps is None else self.train_pool_steps

    @property
    def last_third(self) -> tuple[int, ...]:
        """The analysis checkpoints at or after two thirds of training: where width trends are judged."""
        return tuple(s for s in sorted(self.checkpoint_steps) if 3 * s >= 2 * self.steps)


@dataclass
class Splits:
    """A family's data: each split is a tensor or a tuple of tensors whose first dimension indexes examples."""

    train: Any
    validation: Any
    test: Any
    unit: str
    """What one example is, for messages: ``"sequences of 128 tokens"``, ``"images"``."""
    summary: dict = field(default_factory=dict)
    """Counts and sources for the provenance."""


def count(split: Any) -> int:
    """Number of examples in a split (a tensor or a tuple of tensors)."""
    return int((split[0] if isinstance(split, (tuple, list)) else split).shape[0])


def take(split: Any, index: torch.Tensor) -> Any:
    """The examples ``index`` of a split, in that order."""
    if isinstance(split, (tuple, list)):
        return tuple(part[index] for part in split)
    return split[index]


class Family(abc.ABC):
    """A model family's answers to the width sweep (see the module docstring)."""

    name: ClassVar[str]
    """Short name: the prefix of its results tables (``"llama"`` → ``llama_geometry.csv``)."""
    training_fields: ClassVar[tuple[str, ...]] = ()
    """The family config's own fields that determine the trained weights (checkpoints are keyed by them)."""
    extra_tables: ClassVar[tuple[str, ...]] = ()
    """Names (without the family prefix) of the tables :meth:`extra_rows` fills."""
    modules: ClassVar[tuple[str, ...]] = ()
    """Modules :meth:`build` imports on first use (transformers' model chain: seconds a process). The sweep imports
    them (:meth:`import_modules`) before its job grids fork, so the forked workers share them instead of each
    importing them again."""
    reductions: ClassVar[tuple[str, ...]] = ("shared",)
    """The q reductions captured (:mod:`dalign_core.capture.hooks`); the first is the one width claims are judged on.
    A family whose shared q is a trained bias's gradient (training drives its mean to zero at any width)
    judges the per-position ``"full"`` q and keeps the literal ``"shared"`` one beside it."""

    @abc.abstractmethod
    def load_data(self, config: SweepConfig) -> Splits:
        """Train, validation and test splits."""

    @abc.abstractmethod
    def build(self, config: SweepConfig, width: int, seed: int, splits: Splits) -> nn.Module:
        """A freshly initialized model on the CPU; the same arguments give the same weights."""

    @abc.abstractmethod
    def insertion_points(self, config: SweepConfig, model: nn.Module) -> list[str]:
        """The insertion points captured at every checkpoint (dotted module names)."""

    @abc.abstractmethod
    def primary_layer(self, config: SweepConfig) -> str:
        """The fixed insertion point of the misalignment study."""

    @abc.abstractmethod
    def batches(self, examples: Any, batch_size: int) -> list:
        """Batches of ``examples`` in the form :func:`dalign_core.capture.hooks.accumulate_geometry` takes."""

    @abc.abstractmethod
    def heldout_metric(self, model: nn.Module, examples: Any, config: SweepConfig) -> float:
        """Mean loss (lower is better) of ``model`` on ``examples``; the model's mode is restored."""

    @abc.abstractmethod
    def baseline(self, splits: Splits, examples: Any, config: SweepConfig) -> float:
        """The loss on the same ``examples`` that a trained model must beat."""

    def import_modules(self) -> None:
        """Import :attr:`modules` in this process (before it forks its workers)."""
        for name in self.modules:
            importlib.import_module(name)

    def train_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of one batch (default: a causal LM's mean next-token loss)."""
        return lm_loss(model, batch)

    def model_name(self, config: SweepConfig, width: int) -> str:
        """The name of a run's model in the tables (default ``<name>-N<width>``)."""
        return f"{self.name}-N{width}"

    def for_config(self, config: SweepConfig) -> "Family":
        """The spec that trains ``config``'s models (default: this one). A family whose answers depend on a
        config field that no answer is given (ResNet's ``augment``: :meth:`train_loss` sees a batch only) returns
        the spec for that value; :func:`dalign_repro.families.family` calls it."""
        return self

    def train_settings(self, config: SweepConfig) -> dict[str, Any]:
        """:class:`~dalign_repro.training.loop.TrainConfig` fields beyond the shared ones (optimizer, schedule, clipping)."""
        return {}

    def columns(self, config: SweepConfig) -> dict[str, Any]:
        """Columns stamped on every row of every table: what tells this sweep from its siblings in one experiment."""
        return {}

    def evaluate(self, model: nn.Module, examples: Any, config: SweepConfig) -> tuple[float, dict[str, float]]:
        """``(heldout_metric, other held-out metrics)`` at a checkpoint, the metrics recorded beside the loss in
        every row (e.g. ``{"test_accuracy": 0.91}``); by default the loss alone. A family with more metrics
        overrides it to run the examples through the model once."""
        return self.heldout_metric(model, examples, config), {}

    def failure(self, config: SweepConfig, heldout_loss: float, baseline: float, quality: dict[str, float]) -> str:
        """Why a trained run counts as failed, or ``""``: by default, its held-out loss does not beat the baseline."""
        if heldout_loss < baseline:
            return ""
        return f"held-out loss {heldout_loss:.3f} does not beat the baseline {baseline:.3f}"

    def extra_rows(self, config: SweepConfig, model: nn.Module, heldout_pool: Any, run: dict) -> dict[str, list[dict]]:
        """Family-only measurements of a trained model at its final checkpoint: table name → rows."""
        return {}
