"""Pythia-architecture models of equal depth and different width, trained here: d_align against width.

The paper compares released Pythia models of one depth: pythia-14m / 31m / 70m
(6 layers, d = 128 / 256 / 512) and pythia-2.8b / 6.9b (32 layers, d = 2560 / 4096).
This is the Pythia family of the width sweep (:mod:`dalign_repro.sweep.run`): transformers'
``GPTNeoXForCausalLM`` with Pythia's architecture (:func:`dalign_repro.models.pythia.
pythia_width_variant`: parallel attention and MLP, LayerNorm, rotary on a quarter of
each head, FFN 4d, untied embeddings), trained on the text corpus of the LLaMA
chapter with a learning rate fitted to each width (:mod:`dalign_repro.families.lm` holds
what the two language-model families share; the spec is
:mod:`dalign_repro.families.pythia`).

Two depth regimes, each a sweep of its own, told apart by the ``depth`` column:

* **6 layers** at Pythia's widths divided by ``width_scale`` (``cpu``: 4, so d = 32 /
  64 / 128 with Pythia's 4 / 8 / 8 heads);
* **a deeper regime** standing in for the 32-layer comparison (``cpu``: 12 layers at
  d = 32 / 48 / 64, heads of dimension 16).

Models are initialized as Pythia was (:func:`dalign_repro.models.pythia.pythia_init`).
At ``cpu`` each run sees 0.8M tokens (500 steps of 32 x 64), under one pass over the
training works; two rates per width, three seeds.

The primary insertion point of each regime is the decoder layer at the same relative
depth (``insertion_fraction`` of the way through: layer 2 of 6, layer 5 of 12), so
the regimes are compared at matched relative insertion depth. The released
checkpoints themselves are measured by :mod:`dalign_repro.experiments.pythia_checkpoints`
(network and a GPU).

Run without Jupyter: ``python -m dalign_repro.experiments.pythia_width --profile cpu``
(``--dry-run`` projects the wall time first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dalign_repro.config import measurement_only
from dalign_repro.experiments._sweeps import sweep_experiment
from dalign_repro.families import family
from dalign_repro.families.lm import LMSweepConfig


@dataclass(frozen=True)
class Config(LMSweepConfig):
    """The Pythia sweep (defaults: the ``cpu`` profile; see ``PROFILES`` for the others)."""

    architecture: str = "pythia-70m"
    """The released model whose architecture every width shares (all but width, heads, depth and vocabulary)."""
    depth: int = 6
    widths: tuple[int, ...] = (32, 64, 128)
    heads: tuple[int, ...] = (4, 8, 8)
    """Attention heads at each width (Pythia's: 4 / 8 / 8 at d = 128 / 256 / 512)."""
    width_scale: int = 4
    """Pythia's widths are divided by this to fit the profile (1 = the real widths); the chapter says so."""
    deep_depth: int | None = 12
    """Depth of the second regime (None: only the first)."""
    deep_widths: tuple[int, ...] = (32, 48, 64)
    deep_heads: tuple[int, ...] = (2, 3, 4)
    """Head dimension 16 at every deep width, as pythia-14m and 31m share theirs."""
    insertion_fraction: float = 0.5
    """The primary insertion point is decoder layer ``ceil(fraction * depth) - 1`` of each regime."""
    context: int = 64
    batch_size: int = 32
    steps: int = 500
    warmup_steps: int = 50
    seeds: int = 6
    """The power calculation (:meth:`power_plan`) asks for 8 at 6 layers and 18 for the narrower deep range; 6 is
    what the budget allows, and the chapter states the slope each regime can detect."""
    run_sd: float | None = 0.45
    """Measured on the 6-layer cpu tables of commit 7ac047d: checkpoint SD 0.79 around a run's mean, 0.36 between
    runs of a width; with 9 late checkpoints a run's mean has SD 0.45."""
    lr_candidates: tuple[float, ...] = (1e-2, 2e-2, 4e-2)
    lr_width_exponent: float = 1.0
    """Each width tries the grid scaled by (32 / N), the muP rule for Adam."""
    lr_trial_fraction: float = 1 / 3
    checkpoint_steps: tuple[int, ...] = (0, 50, 150, 340, 360, 380, 400, 420, 440, 460, 480, 500)
    all_layer_steps: tuple[int, ...] | None = (0, 150, 340, 500)
    train_pool_steps: tuple[int, ...] | None = (0, 500)
    pool_size: int = 1024
    checkpoint_pool_size: int | None = measurement_only(None, neutral=None)
    """The whole pool at every checkpoint, unlike the LLaMA sweep's blocks of a quarter (see the field of
    :class:`~dalign_repro.sweep.family.SweepConfig`). Blocks pay where the scatter between checkpoints dwarfs one
    estimate's error; the judged per-position q is the other case. Measured on the cpu models (commit 5a728a3):
    within a run's late window log d_align varies by 0.11 (variance), while one estimate's relative SE is 0.24 on
    1,024 examples and 0.76 on 256, where 2-3% of estimates are not positive. Blocks of 256 raised the slope the
    design can detect from 0.56 to 0.92 (6 layers) and from 0.68 to 1.28 (12 layers), for 12 minutes."""
    budgets: tuple[tuple[int, int], ...] = ((4, 4), (16, 16), (32, 32), (64, 64))

    def __post_init__(self):
        super().__post_init__()
        for widths, heads, what in ((self.widths, self.heads, ""), (self.deep_widths, self.deep_heads, "deep_")):
            if len(widths) != len(heads):
                raise ValueError(f"{what}widths {widths} and {what}heads {heads} must have one entry per width")
        if not 0 < self.insertion_fraction <= 1:
            raise ValueError(f"insertion_fraction must be in (0, 1], got {self.insertion_fraction}")

    def sweeps(self) -> list["Config"]:
        """One sweep per depth regime: the first, then the deep one (if any)."""
        first = replace(self, deep_depth=None)
        if self.deep_depth is None:
            return [first]
        return [first, replace(first, depth=self.deep_depth, widths=self.deep_widths, heads=self.deep_heads)]

    @property
    def insertion_layer(self) -> int:
        return max(math.ceil(self.insertion_fraction * self.depth) - 1, 0)

    def heads_at(self, width: int) -> int:
        return self.heads[self.widths.index(width)]


EXPERIMENT = sweep_experiment("pythia_width", Config, "pythia", description=__doc__)
FAMILY, TABLES = family("pythia"), EXPERIMENT.tables
run = EXPERIMENT.run  # run(config, out_dir=None, force=False): the tables, skipped when current unless force
dry_run = EXPERIMENT.dry_run  # dry_run(config): build, time a few steps, project the wall time

if __name__ == "__main__":
    EXPERIMENT.main()
