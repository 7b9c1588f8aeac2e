"""CIFAR ResNet-20 (He et al., 2016, section 4.2) with a channel-width multiplier.

Three stages of ``n`` basic blocks each (``n = 3`` for ResNet-20), with
``16k``, ``32k`` and ``64k`` channels for width multiplier ``k`` (any k that makes ``16k``
a whole number: 0.5, 0.75, 1, 2, 8, …); the first block
of stages 2 and 3 halves the spatial size. Shortcuts are the paper's option A:
the identity, and where the shape changes, stride-2 subsampling with zero-padded
extra channels (no parameters). BatchNorm after every convolution; global average
pooling and one linear classifier. ≈0.27M parameters at ``k = 1`` with 10 classes.

Module names are stable so that insertion points can be named as dotted paths:
``conv1``, ``bn1``, ``layer1.0`` … ``layer3.2`` (the residual blocks, whose outputs
are the insertion points), ``fc``. :func:`residual_block_names` lists the blocks.

The activation gradients of a BatchNorm network are per-example only in eval
mode (running statistics); capture with ``model.eval()``.

``channels_last=True`` keeps the convolution weights and every activation in NHWC
memory order, which oneDNN's CPU convolutions run faster: on one thread a training
step at batch 64 takes 0.77–0.83 of the NCHW time at k = 0.5 … 1.5, and a capture
batch 0.82–0.86 (``benchmarks/bench_resnet_memory.py``). It is the same function of the input and the
weights, but the kernels sum in another order, so trained weights differ at float
precision: a sweep's checkpoints are keyed by it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BasicBlock", "PadShortcut", "CifarResNet", "resnet20", "residual_block_names"]


class PadShortcut(nn.Module):
    """Option-A shortcut: subsample by ``stride`` and zero-pad channels from ``in_channels`` to ``out_channels``."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        if out_channels < in_channels:
            raise ValueError(f"option-A shortcut cannot reduce channels ({in_channels} -> {out_channels})")
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        extra = self.out_channels - self.in_channels
        if extra:
            # Split the new channels evenly before and after, as in the original implementation.
            x = F.pad(x, (0, 0, 0, 0, extra // 2, extra - extra // 2))
        return x

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels}, stride={self.stride}"


class BasicBlock(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`` with 3x3 convolutions."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = PadShortcut(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """CIFAR ResNet of depth ``6 n + 2`` with width multiplier ``width`` (``k``).

    Args:
        depth: 20, 32, 44, 56, 110, … (``(depth - 2) / 6`` blocks per stage).
        width: channel multiplier k: stages have 16k, 32k, 64k channels (16k must be a whole number).
        num_classes: size of the output (10 for CIFAR-10, 100 for CIFAR-100).
        in_channels: image channels (3).
        normalize: per-channel ``(mean, std)`` subtracted from and divided into the input first (the training set's
            statistics), kept as buffers so a checkpoint carries them; None leaves the input as it is.
        channels_last: hold the convolution weights, and convert the input, to NHWC memory order (see the module
            docstring). The module's logical shapes, names and state dict are the same either way.

    Input: images ``(b, in_channels, H, W)`` (32x32 for CIFAR); output: logits ``(b, num_classes)``.
    """

    def __init__(self, depth: int = 20, width: float = 1, num_classes: int = 10, in_channels: int = 3,
                 normalize: tuple[Sequence[float], Sequence[float]] | None = None,
                 channels_last: bool = False):
        super().__init__()
        mean, std = normalize if normalize is not None else ([0.0] * in_channels, [1.0] * in_channels)
        self.register_buffer("input_mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("input_std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))
        if (depth - 2) % 6 != 0 or depth < 8:
            raise ValueError(f"CIFAR ResNet depth must be 6n + 2 with n >= 1 (20, 32, 44, 56, 110), got {depth}")
        if width <= 0 or 16 * width != int(16 * width):
            raise ValueError(f"width multiplier k must be positive with 16k a whole number of channels (0.5, 1, 2, …), "
                             f"got {width}")
        blocks = (depth - 2) // 6
        self.depth, self.width, self.num_classes = depth, width, num_classes
        base = int(16 * width)
        channels = [base, 2 * base, 4 * base]
        self.conv1 = nn.Conv2d(in_channels, channels[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels[0])
        in_ch = channels[0]
        stages = []
        for stage, out_ch in enumerate(channels):
            layers = []
            for index in range(blocks):
                stride = 2 if (stage > 0 and index == 0) else 1
                layers.append(BasicBlock(in_ch, out_ch, stride))
                in_ch = out_ch
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(channels[2], num_classes)
        self.reset_parameters()
        self.channels_last = channels_last
        if channels_last:
            self.to(memory_format=torch.channels_last)  # the 4-d weights; later .to(device) keeps their order

    def reset_parameters(self) -> None:
        """Kaiming-normal convolutions and linear weights (fan-in), BatchNorm at weight 1 and bias 0."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.input_mean) / self.input_std
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


def resnet20(width: float = 1, num_classes: int = 10,
             normalize: tuple[Sequence[float], Sequence[float]] | None = None,
             channels_last: bool = False) -> CifarResNet:
    """ResNet-20 with channel multiplier ``width`` (≈0.27M parameters at width 1, 10 classes)."""
    return CifarResNet(depth=20, width=width, num_classes=num_classes, normalize=normalize,
                       channels_last=channels_last)


def residual_block_names(model: CifarResNet) -> list[str]:
    """Dotted names of the residual blocks in forward order: ``layer1.0`` … ``layer3.2``."""
    return [name for name, module in model.named_modules() if isinstance(module, BasicBlock)]
