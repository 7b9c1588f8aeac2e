"""Growing at one insertion point: the zero-output block, its hook, and what training it alone brings.

**Growing** (:func:`grow`). A zero-output residual block ``z ← z + W₂ σ(W₁ z)``
(:class:`ZeroOutputBlock`: W₂ = 0, W₁ at ``nn.Linear``'s initialization, as
:mod:`dalign_repro.studies.interventions.compute` inserts it) is added by a forward hook at the point; only
W₁ and W₂ are trained (Adam, constant rate, the model's own parameters frozen for the
duration and the model in its given mode). Before training the grown model computes the
same function (z + 0 = z bit for bit), so the loss on the evaluation examples before is
the model's own. The realized ``gain`` after s steps is that loss before minus after
(nats; positive = growing there helped). The model is restored bit for bit: hooks
removed, parameters, buffers, ``requires_grad`` and mode as they were.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from dalign_core.seeding import derived_seed
from dalign_core.growth.blocks import ZeroOutputBlock, block_for, inserted, mean_loss

__all__ = ["ZeroOutputBlock", "inserted", "block_for", "grow", "seeded_batches"]
"""``ZeroOutputBlock``, ``inserted`` and ``block_for`` live in :mod:`dalign_core.growth.blocks` (``dalign rank`` needs
them); they are named here too so the study reads as one piece."""


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
    device = next(model.parameters()).device
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
