"""One run of a width sweep, trained once and cached, with its held-out q pool: the checkpoint a width chapter
measures by hand with the library's public calls before it reads the sweep's tables.

:func:`sweep_run` returns the final-step model of one (width, seed, rate) run of a sweep, exactly as the sweep
trained it (the same config, data, seed and rate give the same weights on one machine), together with the batches
of the sweep's held-out q pool at that run's family and profile. The weights are kept under the data cache,
``$DALIGN_CACHE/checkpoints/<profile>/<family>/<hash>/`` (or ``$DALIGN_CHECKPOINTS`` where that is set), so a
later build of the book loads them instead of training again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dalign_core.seeding import deterministic_algorithms
from dalign_repro.data.manifest import default_cache_dir
from dalign_repro.sweep.family import Family, SweepConfig, count, take
from dalign_repro.sweep.pools import prepare
from dalign_repro.sweep.trained import trained_model

__all__ = ["SweepRun", "sweep_run"]

CHECKPOINTS_VARIABLE = "DALIGN_CHECKPOINTS"
"""Where a sweep keeps its checkpoints (:func:`dalign_repro.sweep.trained.checkpoint_root`)."""


@dataclass(frozen=True)
class SweepRun:
    """One trained run of a sweep at its final step.

    Attributes:
        model: the trained model in eval mode, on the CPU.
        heldout: the sweep's held-out q pool as batches in the form
            :func:`dalign_core.activation_gradients` takes (``{"input_ids": (b, T)}`` for a language model,
            ``(images (b, C, H, W), labels (b,))`` for an image classifier).
        examples: how many examples the held-out pool holds (the sum of the batches' sizes).
        layer: the family's primary insertion point (a dotted module name).
        width, seed, lr, steps: which run this is: its width N, seed, learning rate and training steps.
        heldout_loss: the model's loss on the sweep's evaluation examples (nats), the number its runs table holds
            for the run: a check that the cached model is the sweep's.
    """

    model: nn.Module
    heldout: list
    examples: int
    layer: str
    width: int
    seed: int
    lr: float
    steps: int
    heldout_loss: float


@contextlib.contextmanager
def _checkpoints_in_cache() -> Iterator[None]:
    """Keep the sweep's checkpoints under the data cache while training, unless a root is already chosen."""
    chosen = os.environ.get(CHECKPOINTS_VARIABLE)
    if chosen:
        yield
        return
    os.environ[CHECKPOINTS_VARIABLE] = str(default_cache_dir() / "checkpoints")
    try:
        yield
    finally:
        os.environ.pop(CHECKPOINTS_VARIABLE, None)


def sweep_run(config: SweepConfig, family: Family, width: int, seed: int, lr: float) -> SweepRun:
    """The final model of the sweep's (``width``, ``seed``, ``lr``) run and the sweep's held-out q pool.

    ``config`` is one sweep's config (one depth regime or data set: an element of ``config.sweeps()`` where the
    experiment has several); ``lr`` is the rate the sweep chose for that run (its ``<family>_runs`` table's ``lr``).
    Loads the cached weights, or trains the run once as the sweep did (deterministic algorithms, one thread) and
    caches them. Raises ``ValueError`` for a width the config does not sweep, ``RuntimeError`` if training diverges.
    """
    if width not in config.widths:
        raise ValueError(f"width {width} is not one of this sweep's widths {tuple(config.widths)}; pick one of them")
    if not lr > 0:
        raise ValueError(f"lr must be the positive rate the sweep chose for this run (its runs table), got {lr!r}")
    deterministic_algorithms()  # as run_sweep trains, so the weights are the sweep's
    splits, _, pools = prepare(config, family)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the sweep's workers train (one thread each): the same sums in the same order
    try:
        with _checkpoints_in_cache():
            model = trained_model(config, family, splits, width, seed, lr)
    finally:
        torch.set_num_threads(threads)
    heldout: Any = take(splits.test, pools.heldout)
    heldout_loss, _ = family.evaluate(model.eval(), take(splits.test, pools.evaluation), config)
    return SweepRun(model=model.eval(), heldout=family.batches(heldout, config.capture_batch),
                    examples=count(heldout), layer=family.primary_layer(config), width=width, seed=seed, lr=lr,
                    steps=config.steps, heldout_loss=float(heldout_loss))
