"""LLaMA models deep enough to rank: the growth study's LLaMA models, at depth 4 (8 at gpu and paper).

A ranking of insertion points needs at least four of them
(:data:`dalign_repro.studies.growth.MIN_POINTS`: with two, any order is a coin flip), and the
width sweep's LLaMA models (:mod:`dalign_repro.experiments.llama_width`) have two decoder
layers. This experiment trains the same family at ``depth`` 4 (the decoder layers'
outputs are the insertion points), with everything else as the width sweep holds it: the
corpus, context, vocabulary, head dimension, batch, steps and schedule, and the rate the
width sweep fitted, 1e-2 at N = 32 carried as 1/N (no rate trials: at depth 2 the fit of
each width kept the 1/N rate at N = 32, 64 and 128). Its
measurement is light (the growth study measures its own predictors on these models): the
geometry at the first and last step only, no redundancy check, no sample-unit study.

The tables (``llama_depth_runs`` and the rest) carry a ``depth`` column; a run that does not
beat the bigram baseline is reported as failed and not grown.

Run without Jupyter: ``python -m dalign_repro.experiments.llama_depth --profile cpu``
(``--dry-run`` projects the wall time first).
"""

from __future__ import annotations

from dataclasses import dataclass

from dalign_repro.experiments.llama_width import Config as LlamaConfig
from dalign_repro.experiments._sweeps import sweep_experiment
from dalign_repro.families import family

__all__ = ["Config", "FAMILY", "TABLES", "EXPERIMENT", "run", "dry_run"]

@dataclass(frozen=True)
class Config(LlamaConfig):
    """LLaMA at depth 4 (defaults: the ``cpu`` profile; see ``PROFILES`` for the others)."""

    depth: int = 4
    widths: tuple[int, ...] = (32, 64, 96, 128)
    """The width sweep's widths up to 128 and 96 between them (N = 256 trains 7 min at depth 2 on one core, about
    twice that here)."""
    seeds: int = 3
    """The growth study grows every seed: 12 models, where its decision reproduces a strong effect 95% of the time
    (6 models: 35%; simulated by :func:`dalign_repro.studies.growth.simulate_decision` at 4 points and 10 repeats)."""
    run_sd: float | None = None
    lr_candidates: tuple[float, ...] = (1e-2,)
    """The width sweep's fitted rate at N = 32 (``llama_runs``' lr), scaled as 32/N by ``lr_width_exponent``."""
    lr_fit: str = "each_width"
    lr_extend: int = 0
    lr_trial_fraction: float = 1.0
    # A light measurement (the growth study measures these models again): two checkpoints, the held-out pool only.
    checkpoint_steps: tuple[int, ...] = (0, 600)
    all_layer_steps: tuple[int, ...] | None = (600,)
    train_pool_steps: tuple[int, ...] | None = None
    redundancy_examples: int = 0
    resamples: int = 2_000
    insertion_layer: int = 1


EXPERIMENT = sweep_experiment("llama_depth", Config, "llama_depth", description=__doc__)
FAMILY, TABLES = family("llama_depth"), EXPERIMENT.tables
run = EXPERIMENT.run  # run(config, out_dir=None, force=False): the tables, skipped when current unless force
dry_run = EXPERIMENT.dry_run  # dry_run(config): build, time a few steps, project the wall time

if __name__ == "__main__":
    EXPERIMENT.main()
