"""One run of the sweep trained: its training config, where its checkpoints live, and the train-or-load step.

* :func:`checkpoints_folder` and :func:`checkpoint_root`: ``checkpoints/<profile>/<family>/<hash>``, keyed by the
  fields that set the weights.
* ``train_config_for``: a measured run's training, or a short rate trial's.
* ``train_run``: train, resume or load one (width, seed, rate) run; a divergence is a failed run, not an error.
* :func:`trained_model`: a finished run's model in eval mode, for the studies that reuse the sweep's models.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from dalign_repro.config import REPO_ROOT
from dalign_repro.sweep.family import Family, Splits, SweepConfig
from dalign_repro.training.loop import TrainConfig, train

__all__ = ["checkpoints_folder", "checkpoint_root", "trained_model", "train_config_for", "train_run"]


def checkpoints_folder() -> Path:
    """Where every sweep keeps its checkpoints: ``$DALIGN_CHECKPOINTS``, else ``checkpoints/`` of the repository."""
    return Path(os.environ.get("DALIGN_CHECKPOINTS") or REPO_ROOT / "checkpoints")


def checkpoint_root(config: SweepConfig, family: Family) -> Path:
    """``<checkpoints_folder()>/<profile>/<family>/<hash>``: keyed by the fields that determine the weights.

    Changing how models are measured (pools, budgets, resamples) reuses the trained
    models. Override the root with ``DALIGN_CHECKPOINTS``.
    """
    root = checkpoints_folder()
    names = config.SHARED_TRAINING_FIELDS + family.training_fields
    fields = {name: getattr(config, name) for name in names}
    key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return root / config.profile / family.name / key


def train_config_for(config: SweepConfig, family: Family, width: int, seed: int, lr: float,
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
    model, result, failure = train_run(config, family, splits, width, seed, lr, torch.device(device))
    if result is None:
        raise RuntimeError(f"{family.name} N={width} seed={seed} lr={lr:g} diverged ({failure}); it has no trained "
                           "model to load")
    return model.eval()


def train_run(config, family, splits, width, seed, lr, device, group=None, trial=False):
    """Train (or resume, or load a finished run); returns (model, TrainResult or None, failure message).

    ``group``: the process group of a job that several ranks train together (data parallel).
    ``trial``: a rate trial (:func:`train_config_for`).
    """
    model = family.build(config, width, seed, splits).to(device)
    try:
        result = train(model, splits.train, train_config_for(config, family, width, seed, lr, trial),
                       loss_fn=family.train_loss, description=f"{family.name} N={width} seed={seed} lr={lr:g}",
                       group=group)
    except FloatingPointError as err:  # diverged: a failed run, reported, never measured
        return model, None, str(err)
    return model, result, ""
