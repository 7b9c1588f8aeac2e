"""Growing at one insertion point: the zero-output block, its hook, and what training it alone brings.

**Growing** (:func:`grow`). A zero-output residual block ``z ← z + W₂ σ(W₁ z)``
(:class:`ZeroOutputBlock`: W₂ = 0, W₁ at ``nn.Linear``'s initialization, as
:mod:`dalign_core.studies.interventions.compute` inserts it) is added by a forward hook at the point; only
W₁ and W₂ are trained (Adam, constant rate, the model's own parameters frozen for the
duration and the model in its given mode). Before training the grown model computes the
same function (z + 0 = z bit for bit), so the loss on the evaluation examples before is
the model's own. The realized ``gain`` after s steps is that loss before minus after
(nats; positive = growing there helped). The model is restored bit for bit: hooks
removed, parameters, buffers, ``requires_grad`` and mode as they were.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from dalign_core._tensor import derived_seed
from dalign_core.capture.layers import resolve_layers
from dalign_core.studies.blocks import ZeroBlock, added, feature_dim, insertion_width, mean_loss

__all__ = ["ZeroOutputBlock", "inserted", "block_for", "grow", "seeded_batches"]


class ZeroOutputBlock(nn.Module):
    """``W₂ σ(W₁ z)`` on the feature axis of z, W₂ = 0 and W₁ as ``nn.Linear`` draws it (no biases), trainable.

    W₁ is the one :mod:`dalign_core.studies.interventions.compute` draws for the same width, hidden size and seed.
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


def grow(model: nn.Module, layer: str, train_batches: Iterable, eval_batches: list, budgets: Sequence[int], *,
         lr: float, hidden: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Insert a :class:`ZeroOutputBlock` at ``layer``, train only it, and read the loss of ``eval_batches``.

    Args:
        train_batches: an iterable of training batches, at least ``max(budgets)`` of them (one per step).
        eval_batches: the examples whose mean loss is read before training and after each budget.
        budgets: numbers of Adam steps after which the loss is read.
        lr: Adam's (constant) rate; ``seed`` draws W₁.

    Returns:
        ``{"before": loss, "after": {steps: loss}, "gain": {steps: before − after}}`` (nats). The model is
        left exactly as it was.
    """
    budgets = sorted(set(int(b) for b in budgets))
    if not budgets or budgets[0] < 1:
        raise ValueError(f"budgets must be positive numbers of steps, got {budgets}")
    device, _ = _device_dtype(model)
    block = block_for(model, layer, eval_batches[0], hidden, seed)
    optimizer = torch.optim.Adam(block.parameters(), lr=lr)
    after = {}
    with inserted(model, layer, block):
        with torch.no_grad():
            before = float(mean_loss(model, eval_batches, device))
        batches = iter(train_batches)
        for step in range(1, budgets[-1] + 1):
            try:
                batch = next(batches)
            except StopIteration:
                raise ValueError(f"train_batches ran out after {step - 1} steps; {budgets[-1]} are needed") from None
            with torch.enable_grad():
                loss = mean_loss(model, [batch], device)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            optimizer.step()
            if step in budgets:
                with torch.no_grad():
                    after[step] = float(mean_loss(model, eval_batches, device))
    for p in block.parameters():
        p.grad = None
    return {"before": before, "after": after, "gain": {s: before - a for s, a in after.items()}}


def seeded_batches(make: Callable[[torch.Tensor], Any], n: int, batch_size: int, seed: Any) -> Iterator:
    """An endless stream of batches ``make(indices)`` of ``batch_size`` random examples of ``n``, seeded by ``seed``."""
    generator = torch.Generator().manual_seed(derived_seed("growth-batches", seed))
    while True:
        yield make(torch.randint(0, n, (batch_size,), generator=generator))
