"""What both studies insert into a trained model: hooks that add to a module's output, and the zero-output block.

A study inserts a zero-initialized parameter at an insertion point ``z`` (a module's output) and measures the loss
with and without it. These are the pieces the intervention study (:mod:`dalign_repro.studies.interventions`) and the
growth study (:mod:`dalign_repro.studies.growth`) share: the feature axis of ``z``, a forward hook that adds to ``z``
while inside a ``with`` block, the mean per-example loss over batches, the feature width of ``z``, and the
zero-output residual block ``W₂ σ(W₁ z)`` drawn as ``nn.Linear`` initializes it.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from dalign_core.capture.batches import call_model, split_batch, to_device
from dalign_core.capture.gradients import primary_output
from dalign_core.capture.layers import resolve_layers
from dalign_core.capture.losses import per_example_loss

__all__ = ["feature_dim", "added", "mean_loss", "insertion_width", "ZeroBlock", "ZeroOutputBlock", "inserted", "block_for"]


def feature_dim(z: torch.Tensor) -> int:
    """The feature axis of an insertion point's output: last for ``(b, T, N)``, 1 for ``(b, C, *spatial)``."""
    if z.ndim == 3 or z.ndim == 2:
        return z.ndim - 1
    if z.ndim >= 4:
        return 1
    raise ValueError(f"cannot insert a residual parameter into an output of shape {tuple(z.shape)}")


@contextlib.contextmanager
def added(module: nn.Module, add: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """While inside, ``module``'s output ``z`` becomes ``z + add(z)``; the hook is removed on exit, also on error."""
    def hook(_module, _args, output):
        z, rebuild = primary_output(output)
        return rebuild(z + add(z))

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def mean_loss(model: nn.Module, batches: Iterable[Any], device: torch.device, counted: list | None = None
              ) -> torch.Tensor:
    """Mean per-example loss over every example of ``batches`` (a differentiable scalar).

    Floating inputs (images) take the model's dtype, so a float64 copy of a model takes the same batches.
    ``counted``, if given, receives the number of examples."""
    dtype = next(model.parameters()).dtype
    total, count = 0.0, 0
    for batch in batches:
        inputs, targets = split_batch(batch)
        inputs, targets = to_device(inputs, device, dtype), to_device(targets, device)
        losses = per_example_loss(call_model(model, inputs), inputs, targets)
        total = total + losses.sum()
        count += losses.numel()
    if not count:
        raise ValueError("no examples: pass at least one non-empty batch")
    if counted is not None:
        counted.append(count)
    return total / count


@torch.no_grad()
def insertion_width(model, module, batch, device) -> int:
    """The feature width N of ``module``'s output, from one forward pass of ``batch``."""
    widths: list[int] = []

    def probe(z):
        widths.append(z.shape[feature_dim(z)])
        return torch.zeros((), dtype=z.dtype, device=z.device)

    with added(module, probe):
        mean_loss(model, [batch], device)
    return widths[0]


class ZeroBlock(nn.Module):
    """``W₂ σ(W₁ z)`` on the feature axis, ``W₂ = 0``, ``W₁`` as ``nn.Linear`` initializes it (no biases)."""

    def __init__(self, width: int, hidden: int, generator: torch.Generator):
        super().__init__()
        bound = 1 / math.sqrt(width)  # nn.Linear's default: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), ...)
        self.w1 = (torch.rand(hidden, width, generator=generator, dtype=torch.float64) * 2 - 1) * bound
        self.w2 = torch.zeros(width, hidden, dtype=torch.float64)

    def features(self, z: torch.Tensor) -> torch.Tensor:
        return F.gelu(torch.movedim(z, feature_dim(z), -1) @ self.w1.to(z).T)

    def output(self, z: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return torch.movedim(self.features(z) @ w2.to(z).T, -1, feature_dim(z))


class ZeroOutputBlock(nn.Module):
    """``W₂ σ(W₁ z)`` on the feature axis of z, W₂ = 0 and W₁ as ``nn.Linear`` draws it (no biases), trainable.

    W₁ is the one :mod:`dalign_repro.studies.interventions.compute` (the reproduction) draws for the same width, hidden size and seed.
    """

    def __init__(self, width: int, hidden: int | None = None, seed: int = 0, dtype=torch.float32, device=None):
        super().__init__()
        drawn = ZeroBlock(width, hidden or width, torch.Generator().manual_seed(seed))
        self.w1 = nn.Parameter(drawn.w1.to(device=device, dtype=dtype))
        self.w2 = nn.Parameter(drawn.w2.to(device=device, dtype=dtype))

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """σ(W₁ z) with the feature axis last: ``(b, positions…, hidden)``."""
        return torch.nn.functional.gelu(torch.movedim(z, feature_dim(z), -1) @ self.w1.T)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.movedim(self.features(z) @ self.w2.T, -1, feature_dim(z))


@contextlib.contextmanager
def inserted(model: nn.Module, layer: str, block: nn.Module) -> Iterator[nn.Module]:
    """While inside, ``layer``'s output z becomes ``z + block(z)`` and only ``block`` can be trained.

    The model's parameters are frozen for the duration (``requires_grad`` restored on exit, also on
    error), so a backward pass runs only from the loss down to the block; the hook is removed on exit.
    """
    (module,) = resolve_layers(model, layer).values()
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        with added(module, block):
            yield module
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


def block_for(model: nn.Module, layer: str, probe_batch, hidden: int | None = None, seed: int = 0
              ) -> ZeroOutputBlock:
    """The zero-output block for ``layer`` (its width read from one forward pass of ``probe_batch``)."""
    (module,) = resolve_layers(model, layer).values()
    device, dtype = _device_dtype(model)
    width = insertion_width(model, module, probe_batch, device)
    return ZeroOutputBlock(width, hidden, seed, dtype=dtype, device=device)
