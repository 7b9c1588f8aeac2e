"""The examples a sweep reads: the data checked to supply the config, and the pools drawn once per sweep.

* :func:`check_supply`: refuse, before anything trains, a config the splits cannot supply.
* :class:`Pools` and :func:`draw_pools`: the train, held-out, evaluation and validation indices every width and
  seed share (a paired comparison).
* :func:`prepare`: the family's data, its facts for the provenance, and the pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dalign_core.seeding import derived_seed
from dalign_repro.data.supply import check_epochs, require_sequences, training_epochs
from dalign_repro.sweep.family import Family, Splits, SweepConfig, count

__all__ = ["Pools", "check_supply", "draw_pools", "prepare"]


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

    Raises :class:`~dalign_repro.data.supply.DataSupplyError` with the numbers, and warns
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
