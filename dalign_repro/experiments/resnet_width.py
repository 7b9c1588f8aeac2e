"""ResNet-20 at several channel widths: d_align and misalignment against the width multiplier k.

The ResNet family of the width sweep (:mod:`dalign_repro.sweep.run`; its spec is
:mod:`dalign_repro.families.resnet`): the CIFAR ResNet-20
of :mod:`dalign_repro.models.resnet` with stages of 16k, 32k and 64k channels, depth
and data held fixed and only k varied. A run's ``width`` is its first stage's
channel count 16k (so k = width / 16). One sample is one image; its loss is the
cross-entropy of its label; q at a residual block is the gradient of that loss with
respect to the block's output, summed over positions — the gradient of a
zero-initialized per-channel bias shared over positions (the ``shared`` reduction,
dimension 16k, 32k or 64k by stage). q is captured in eval mode (BatchNorm on its
running statistics), the only mode in which examples do not interact.

Training is the CIFAR recipe of He et al. (2016): SGD with momentum 0.9, weight
decay 1e-4, the rate divided by 10 at half and three quarters of training, random
crop with padding 4 and horizontal flip. The ``paper`` profile runs it in full (200
epochs at batch 128, peak rate 0.1) on CIFAR-10 and CIFAR-100. The ``cpu`` profile
runs the same recipe for 500 steps of batch 64 (about 0.6 of an epoch, no
augmentation: one pass sees no image twice; two rates per width) on Fashion-MNIST, which Debian ships,
standing in for CIFAR-10 at k = 0.5 … 1.5; the CIFAR results need the real archives
(``make data PROFILE=paper``).

A run fails — reported, never part of a trend — when it diverges, when its held-out
loss does not beat the class-prior baseline, or when its test accuracy falls below
``min_test_accuracy``, a floor well under what ResNet-20 reaches on the data set.

Run without Jupyter: ``python -m dalign_repro.experiments.resnet_width --profile gpu``
(``--dry-run`` projects the wall time first).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dalign_repro.experiments._sweeps import sweep_experiment
from dalign_repro.families import family
from dalign_repro.sweep.family import SweepConfig


@dataclass(frozen=True)
class Config(SweepConfig):
    """The ResNet-20 sweep (defaults: the ``cpu`` profile; see ``PROFILES`` for the others)."""

    widths: tuple[int, ...] = (8, 12, 16, 24)
    """First-stage channels 16k: k = 0.5, 0.75, 1, 1.5."""
    dataset: str = "fashion-mnist"
    """``"fashion-mnist"`` (offline, stands in for CIFAR-10), ``"cifar10"``, ``"cifar100"`` or ``"synthetic"``."""
    more_datasets: tuple[str, ...] = ()
    """Further data sets, each a sweep of its own with the same settings (the paper: CIFAR-100 beside CIFAR-10)."""
    data_root: str | None = None
    """A folder holding the archives already (no network needed); default: the data cache."""
    validation_images: int = 5000
    """Training images set aside, at random, to choose the learning rate."""
    steps: int = 500
    batch_size: int = 64
    seeds: int = 4
    """As many as the budget allows; the power calculation (:meth:`power_plan`) asks for 18, and the chapter
    states the slope 4 can detect."""
    run_sd: float | None = 0.59
    """Measured on the cpu tables of commit 7ac047d (the shared q): checkpoint SD 1.02 around a run's mean, 0.47
    between runs of a width; with 9 late checkpoints a run's mean has SD 0.59."""
    lr_trial_fraction: float = 1 / 3
    lr_candidates: tuple[float, ...] = (0.05, 0.1, 0.2)
    """Peak SGD rates; each width keeps the one with the lowest validation loss (BatchNorm makes the best rate
    nearly width-independent, so the grid does not move with width)."""
    warmup_steps: int = 30
    weight_decay: float = 1e-4
    momentum: float = 0.9
    milestones: tuple[float, ...] = (0.5, 0.75)
    """The rate is divided by 10 at these fractions of training (epochs 100 and 150 of 200)."""
    augment: bool = False
    """Random crop (padding 4) and horizontal flip of every training image."""
    channels_last: bool = True
    """Convolutions in NHWC memory order (:mod:`dalign_repro.models.resnet`): a training step takes 0.77-0.83 of
    its NCHW time on this machine's CPU (``benchmarks/bench_resnet_memory.py``). The kernels sum in another order, so the trained weights differ at float
    precision; the checkpoints are keyed by it."""
    checkpoint_steps: tuple[int, ...] = (0, 50, 150, 340, 360, 380, 400, 420, 440, 460, 480, 500)
    all_layer_steps: tuple[int, ...] | None = (0, 150, 340, 500)
    train_pool_steps: tuple[int, ...] | None = (0, 500)
    pool_size: int = 512
    eval_examples: int = 1024
    validation_examples: int = 1024
    capture_batch: int = 128
    budgets: tuple[tuple[int, int], ...] = ((4, 4), (16, 16), (32, 32), (64, 64))
    insertion_block: str = "layer2.2"
    """The residual block whose output is the primary insertion point (the end of the middle stage)."""
    min_test_accuracy: float = 0.75
    """A run below this test accuracy failed: it did not learn. Set well under what training reaches, so that it
    never sorts runs that trained: the cpu sweep's 500 steps (0.58 epochs of Fashion-MNIST) reached 0.81-0.87 at
    every width (commit 624f17e), where a floor of 0.85 had failed 7 of 16 runs that beat the class-prior
    baseline by 1.8 nats or more."""

    def __post_init__(self):
        super().__post_init__()
        bad = [w for w in self.widths if w < 1]
        if bad:
            raise ValueError(f"widths {bad} are not channel counts; a width is the first stage's channels, 16k")
        if not 0 <= self.min_test_accuracy < 1:
            raise ValueError(f"min_test_accuracy must be in [0, 1), got {self.min_test_accuracy}")
        from dalign_repro.data.images import IMAGE_SETS

        unknown = [name for name in (self.dataset, *self.more_datasets) if name not in IMAGE_SETS]
        if unknown:  # here, not after the first data set's sweep has trained
            raise ValueError(f"unknown image set(s) {unknown} in dataset/more_datasets; choose from "
                             f"{', '.join(IMAGE_SETS)}")
        blocks = [f"layer{stage}.{block}" for stage in (1, 2, 3) for block in (0, 1, 2)]  # ResNet-20's
        if self.insertion_block not in blocks:
            raise ValueError(f"insertion_block {self.insertion_block!r} is not a residual block of ResNet-20; choose "
                             f"one of {', '.join(blocks)}")

    def sweeps(self) -> list["Config"]:
        """One sweep per data set (``dataset``, then ``more_datasets``)."""
        return [replace(self, dataset=name, more_datasets=()) for name in (self.dataset, *self.more_datasets)]


EXPERIMENT = sweep_experiment("resnet_width", Config, "resnet", description=__doc__)
FAMILY, TABLES = family("resnet"), EXPERIMENT.tables
run = EXPERIMENT.run  # run(config, out_dir=None, force=False): the tables, skipped when current unless force
dry_run = EXPERIMENT.dry_run  # dry_run(config): build, time a few steps, project the wall time

if __name__ == "__main__":
    EXPERIMENT.main()
