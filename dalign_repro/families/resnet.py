"""The ResNet family: the CIFAR ResNet-20 at channel widths 16k, on an image set.

:func:`dalign_repro.models.resnet.resnet20` with stages of 16k, 32k and 64k channels, depth and data held fixed and
only k varied. A run's ``width`` is its first stage's channel count 16k (so k = width / :data:`STAGE_WIDTH`). One
sample is one image; its loss is the cross-entropy of its label; q at a residual block is the gradient of that loss
with respect to the block's output (per position, ``full``, judged; and summed over positions, ``shared``). q is
captured in eval mode (BatchNorm on its running statistics), the only mode in which examples do not interact.

Training is the CIFAR recipe of He et al. (2016) (:meth:`ResNetFamily.train_settings`: SGD with momentum, the rate
divided by 10 at the ``milestones``), with random crop and flip where the config's ``augment`` asks
(:meth:`ResNetFamily.for_config`). A run fails when its held-out loss does not beat the class-prior baseline or its
test accuracy falls below ``min_test_accuracy``.

The config a ResNet spec reads is the ResNet chapter's (:class:`dalign_repro.experiments.resnet_width.Config`, one
data set of it: ``dataset``, ``data_root``, ``validation_images``, ``momentum``, ``milestones``, ``augment``,
``channels_last``, ``insertion_block``, ``min_test_accuracy``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from dalign_core.seeding import derived_seed
from dalign_repro.data.images import load_images
from dalign_repro.models.resnet import residual_block_names, resnet20
from dalign_repro.sweep.family import Family, Splits, count
from dalign_repro.training.evaluation import eval_mode

__all__ = ["STAGE_WIDTH", "ResNetFamily", "to_float", "augment"]

STAGE_WIDTH = 16
"""Channels of the first stage at k = 1: a run's width is ``STAGE_WIDTH * k``."""


class ResNetFamily(Family):
    """CIFAR ResNet-20 at channel widths 16k (see the module docstring)."""

    name = "resnet"
    reductions = ("full", "shared")
    """The shared q at a block output lies almost wholly in the span of the next block's BatchNorm biases'
    gradients (:mod:`dalign_core.capture.redundancy`): width claims are judged on the per-position q."""
    training_fields = ("dataset", "validation_images", "momentum", "milestones", "augment", "channels_last")

    def __init__(self, augment: bool = False):
        self.augment = augment
        """Whether :meth:`train_loss` crops and flips each training image at random (:func:`augment`)."""

    def for_config(self, config: Any) -> "ResNetFamily":
        """The spec that trains ``config``'s models: augmented where its ``augment`` says so."""
        return self if bool(config.augment) == self.augment else ResNetFamily(augment=bool(config.augment))

    def load_data(self, config: Any) -> Splits:
        data = load_images(config.dataset, root=config.data_root)
        if config.validation_images >= len(data.train_labels):
            raise ValueError(f"validation_images={config.validation_images} leaves no training images of "
                             f"{len(data.train_labels)}; set it lower")
        # A fixed random split (the sweep's seed draws pools, not this): validation is never trained on.
        order = torch.randperm(len(data.train_labels), generator=torch.Generator().manual_seed(
            derived_seed("resnet-validation", config.dataset)))
        held, kept = order[:config.validation_images], order[config.validation_images:]
        return Splits(
            train=(data.train_images[kept], data.train_labels[kept]),
            validation=(data.train_images[held], data.train_labels[held]),
            test=(data.test_images, data.test_labels), unit=f"{config.dataset} images",
            summary={**data.summary, "num_classes": data.num_classes, "mean": list(data.mean), "std": list(data.std),
                     "train": len(kept), "validation": len(held), "test": len(data.test_labels)},
        )

    def build(self, config: Any, width: int, seed: int, splits: Splits):
        torch.manual_seed(seed)
        return resnet20(width / STAGE_WIDTH, num_classes=splits.summary["num_classes"],
                        normalize=(splits.summary["mean"], splits.summary["std"]), channels_last=config.channels_last)

    def insertion_points(self, config: Any, model) -> list[str]:
        return residual_block_names(model)

    def primary_layer(self, config: Any) -> str:
        return config.insertion_block

    def model_name(self, config: Any, width: int) -> str:
        return f"resnet20-k{width / STAGE_WIDTH:g}"

    def columns(self, config: Any) -> dict:
        return {"dataset": config.dataset}

    def train_settings(self, config: Any) -> dict:
        return dict(optimizer="sgd", momentum=config.momentum, schedule="step", milestones=config.milestones,
                    grad_clip=None)

    def batches(self, examples: tuple, batch_size: int) -> list:
        images, labels = examples
        return [(to_float(images[i:i + batch_size]), labels[i:i + batch_size])
                for i in range(0, len(labels), batch_size)]

    def train_loss(self, model, batch: tuple) -> torch.Tensor:
        images, labels = batch
        inputs = augment(to_float(images)) if self.augment else to_float(images)
        return F.cross_entropy(model(inputs), labels)

    @torch.no_grad()
    def _scores(self, model, examples: tuple, config: Any) -> tuple[float, float]:
        """(mean cross-entropy in nats, accuracy) of ``model`` on ``examples``, in eval mode."""
        device = next(model.parameters()).device
        nll, correct = 0.0, 0
        with eval_mode(model):
            for inputs, labels in self.batches(examples, config.capture_batch):
                logits = model(inputs.to(device)).float()
                labels = labels.to(device)
                nll += float(F.cross_entropy(logits, labels, reduction="sum"))
                correct += int((logits.argmax(dim=1) == labels).sum())
        return nll / count(examples), correct / count(examples)

    def heldout_metric(self, model, examples: tuple, config: Any) -> float:
        return self._scores(model, examples, config)[0]

    def quality(self, model, examples: tuple, config: Any) -> dict:
        return {"test_accuracy": self._scores(model, examples, config)[1]}

    def evaluate(self, model, examples: tuple, config: Any) -> tuple[float, dict]:
        loss, accuracy = self._scores(model, examples, config)  # one pass over the evaluation images, not two
        return loss, {"test_accuracy": accuracy}

    def baseline(self, splits: Splits, examples: tuple, config: Any) -> float:
        """Cross-entropy of predicting the training set's class frequencies (add-one smoothed)."""
        classes = splits.summary["num_classes"]
        frequency = (torch.bincount(splits.train[1], minlength=classes).double() + 1) / (count(splits.train) + classes)
        return float(-frequency.log()[examples[1]].mean())

    def failure(self, config: Any, heldout_loss: float, baseline: float, quality: dict) -> str:
        reason = super().failure(config, heldout_loss, baseline, quality)
        accuracy = quality["test_accuracy"]
        if not reason and not accuracy >= config.min_test_accuracy:
            reason = f"test accuracy {accuracy:.3f} is below the floor {config.min_test_accuracy:.2f}"
        return reason


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 images → float in [0, 1] (the model normalizes them by the training set's statistics)."""
    return images.float() / 255


def augment(images: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """Random crop of each ``(b, C, H, W)`` image after zero padding by ``padding``, then a random horizontal flip.

    Draws from the global torch generator, whose state every resume point saves, so a
    resumed run draws the same crops and flips as an uninterrupted one.
    """
    b, _, height, width = images.shape
    padded = F.pad(images, (padding,) * 4)
    rows = torch.randint(0, 2 * padding + 1, (b,)).tolist()
    cols = torch.randint(0, 2 * padding + 1, (b,)).tolist()
    flips = torch.rand(b) < 0.5
    out = torch.stack([padded[i, :, r:r + height, c:c + width] for i, (r, c) in enumerate(zip(rows, cols))])
    return torch.where(flips.view(b, 1, 1, 1).to(images.device), out.flip(3), out)
