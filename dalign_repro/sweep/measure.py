"""Measuring one trained run of the width sweep: the q pools' geometry at every analysis checkpoint, the
misalignment at the final one, and the redundancy check.

* :func:`checkpoint_pool`: which examples of a q pool a checkpoint captures.
* ``measure_trained``: geometry rows at every checkpoint (every reduction from one capture), and the final
  checkpoint's accumulators.
* ``misalignment_rows``: resampled ``Pr(mu_M^T g_K <= 0)`` with the bounds where the theorem covers the setting.
* ``measure_redundancy``: the redundancy check's rows at the primary layer.

:mod:`dalign_repro.sweep.run` calls these for each measured (width, seed) run.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dalign_repro.sweep.family import SweepConfig, count, take
from dalign_core.capture.hooks import accumulate_geometry
from dalign_core.geometry.misalignment import cross_gram, misalignment_probability
from dalign_core.capture.redundancy import redundancy_rows
from dalign_core.geometry.bounds import b_align
from dalign_repro.training.checkpoints import load_weights

__all__ = ["NO_BOUND", "checkpoint_pool", "measure_trained", "misalignment_rows", "measure_redundancy"]

NO_BOUND = "the train and held-out means come from different laws; the theorem does not cover this setting"


def checkpoint_pool(config: SweepConfig, examples: Any, step: int) -> Any:
    """The examples of a q pool captured at checkpoint ``step``: all of them at the final step, else
    ``config.checkpoint_pool_size`` of them, the next block of the pool at each successive checkpoint (wrapping
    around), so that a run's checkpoints together see the whole pool. The pools are drawn in random order, so
    each block is a uniform subsample, and every run sees the same block at the same checkpoint.

    Why blocks that move: the estimation errors of checkpoints captured on one subsample share that subsample's
    idiosyncrasy and do not average out over a run's late window (measured on the LLaMA cpu sweep: the first
    quarter at every checkpoint moved the run means by an SD of 0.19 in log d_align); on disjoint blocks they do.
    """
    size = config.checkpoint_pool_size
    if step == config.steps or size is None or size >= count(examples):
        return examples
    start = sorted(config.checkpoint_steps).index(step) * size
    return take(examples, (start + torch.arange(size)) % count(examples))


def measure_trained(config, family, model, result, splits, pools, base, device):
    """Geometry rows at every analysis checkpoint; the final checkpoint's accumulators at the primary layer.

    Every checkpoint captures the primary insertion point; those of ``all_layer_steps`` capture every
    insertion point. The checkpoints before the last capture ``checkpoint_pool_size`` examples of each pool, a
    different block at each (:func:`checkpoint_pool`), the last one the whole pool. Each of the family's
    ``reductions`` is a row of its own (``reduction`` column); the final accumulators (for the misalignment study)
    are the judged reduction's.
    """
    layers, primary = family.insertion_points(config, model), family.primary_layer(config)
    pool_examples = {"train": take(splits.train, pools.train), "heldout": take(splits.test, pools.heldout)}
    evaluation = take(splits.test, pools.evaluation)
    rows, final = [], {}
    for step in sorted(result.checkpoints):
        load_weights(model, result.checkpoints[step])
        model.eval()
        heldout_loss, quality = family.evaluate(model, evaluation, config)
        captured = layers if config.layer_steps(step) else [primary]
        for pool in ("heldout", "train"):
            if pool == "train" and step not in config.train_pool_checkpoints:
                continue
            batches = family.batches(checkpoint_pool(config, pool_examples[pool], step), config.capture_batch)
            # every reduction from one backward pass; the forward's determinism is checked once per run
            by_reduction = accumulate_geometry(model, captured, batches, reduction=list(family.reductions),
                                               device=device, check_determinism=not rows)
            for reduction, accumulators in by_reduction.items():
                for layer, accumulator in accumulators.items():
                    rows.append({**base, "step": step, "pool": pool, "layer": layer, "reduction": reduction,
                                 "heldout_loss": heldout_loss, **quality,
                                 **accumulator.result(config.confidence).to_row()})
                if step == config.steps and reduction == family.reductions[0]:
                    final[pool] = accumulators[primary]
        if step == config.steps:  # fresh examples for the out-of-sample check of the certificates
            final["evaluation"] = accumulate_geometry(model, primary, family.batches(evaluation, config.capture_batch),
                                                      reduction=family.reductions[0], device=device,
                                                      check_determinism=False)
    return rows, final, heldout_loss, quality


def misalignment_rows(config, final, base, layer, reduction) -> list[dict]:
    """Resampled misalignment at the final checkpoint; bounds only where the theorem covers the setting.

    Settings (M's pool / K's pool) and where the certificate comes from:

    * ``heldout/heldout``: p̂ resampled from the held-out pool whose U-statistics give B_exact and
      B_align (``estimate_pool`` = ``resample_pool``): Cantelli's inequality on the pool's own law, so
      "p̂ ≤ B_exact" there is algebra, not evidence;
    * ``evaluation/evaluation``: the same certificates, p̂ resampled from the evaluation examples, which
      are disjoint from the held-out pool: the out-of-sample check (budgets with 4(M + K) ≤ its size);
    * ``train/heldout``: M from the train pool: the growth method's question, outside the theorem.
    """
    heldout, train_pool, evaluation = final["heldout"], final["train"], final["evaluation"]
    geometry = heldout.result(config.confidence)
    d_align_lo = geometry.intervals["d_align"].lo
    grams = {"heldout/heldout": (heldout.gram(), True, "heldout", "heldout"),
             "evaluation/evaluation": (evaluation.gram(), True, "heldout", "evaluation"),
             "train/heldout": (cross_gram(train_pool.rows(), heldout.rows()), False, "", "train+heldout")}
    rows = []
    for M, K in config.budgets:
        for setting, (C, one_pool, estimate_pool, resample_pool) in grams.items():
            if one_pool and 4 * (M + K) > C.shape[0]:
                continue  # the two means would share too much of a small pool
            estimate = misalignment_probability(None, C=C, one_pool=one_pool, M=M, K=K, trials=config.resamples,
                                                seed=base["seed"], confidence=config.confidence)
            covered = one_pool
            rows.append(dict(
                family=base["family"], model=base["model"], width=base["width"], seed=base["seed"], lr=base["lr"],
                layer=layer, reduction=reduction, setting=setting, estimate_pool=estimate_pool,
                resample_pool=resample_pool, M=M, K=K, trials=estimate.trials, p_misalign=estimate.p_misalign,
                p_misalign_lo=estimate.p_misalign_lo, p_misalign_hi=estimate.p_misalign_hi,
                b_exact=geometry.b_exact(M, K) if covered else math.nan,
                b_align=geometry.b_align(M, K) if covered else math.nan,
                # B_align at the interval's lower end: the certificate the data can vouch for (1 when it reaches 0).
                b_align_at_lo=(b_align(max(d_align_lo, 0.0), M, K) if covered else math.nan),
                d_align=geometry.d_align, d_align_lo=d_align_lo, bound_note="" if covered else NO_BOUND,
                trained_ok=base["trained_ok"],
            ))
    return rows


def measure_redundancy(config, family, model, heldout, examples: int, device, seed: int) -> list[dict]:
    """The redundancy check's rows (:func:`~dalign_core.capture.redundancy.redundancy_rows`) at the primary layer, on the
    first ``examples`` of the held-out pool ``heldout``, with the model in eval mode."""
    batches = family.batches(take(heldout, torch.arange(min(examples, count(heldout)))), config.capture_batch)
    return redundancy_rows(model.eval(), [family.primary_layer(config)], batches, reductions=family.reductions,
                           device=device, seed=seed)
