"""The losses a model is trained and judged on: the causal LM loss, held-out evaluation, eval mode.

:func:`lm_loss` is the default loss of :func:`dalign_repro.training.loop.train`;
:func:`evaluate_lm_loss` and :func:`evaluate_loss` score a model on held-out data in
eval mode (its train/eval mode restored afterwards), batch by batch, in the layout
``train`` takes: a tensor or a tuple of tensors whose first dimension indexes examples.
The batch helpers below (taking rows of such data onto a device, autocast by name) serve
the training loop too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

__all__ = ["lm_loss", "evaluate_lm_loss", "evaluate_loss", "eval_mode", "autocast_to", "data_len", "take_rows"]


def lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a causal LM on a ``(B, T)`` batch of token ids."""
    return model(input_ids=batch, labels=batch).loss


def data_len(data) -> int:
    """The number of examples in ``data``: a tensor, or a tuple of tensors with one leading length."""
    if isinstance(data, torch.Tensor):
        return int(data.shape[0])
    if isinstance(data, (tuple, list)) and data:
        n = {int(t.shape[0]) for t in data}
        if len(n) != 1:
            raise ValueError(f"tensors in data have different first dimensions {sorted(n)}")
        return n.pop()
    raise TypeError("data must be a tensor or a non-empty tuple of tensors")


def take_rows(data, idx: torch.Tensor, device):
    """Rows ``idx`` of ``data`` (a tensor or a tuple of tensors) on ``device``."""
    if isinstance(data, torch.Tensor):
        return data[idx].to(device, non_blocking=True)
    return tuple(t[idx].to(device, non_blocking=True) for t in data)


def autocast_to(device: torch.device, dtype_name: str | None):
    """``torch.autocast`` to ``dtype_name`` (e.g. ``"bfloat16"``) on ``device``'s type; a no-op context for None."""
    if not dtype_name:
        return contextlib.nullcontext()
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"autocast_dtype {dtype_name!r} is not a torch dtype; use e.g. 'bfloat16' or 'float16', "
                         "or None for full precision")
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """``model.eval()`` inside the block; the model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate_lm_loss(
    model: torch.nn.Module,
    sequences: torch.Tensor,
    *,
    batch_size: int = 64,
    max_sequences: int | None = None,
    autocast_dtype: str | None = None,
) -> float:
    """Mean next-token cross-entropy (nats) over all predicted positions of ``sequences``.

    Each ``(T,)`` sequence contributes its ``T - 1`` predictions (tokens 1..T-1 from the
    ones before), the positions :func:`lm_loss` trains on and
    :func:`dalign_repro.training.baselines.bigram_heldout_loss` scores.  ``max_sequences`` uses
    the first that many.  The model's train/eval mode is restored afterwards.
    """
    if sequences.ndim != 2 or sequences.shape[1] < 2:
        raise ValueError(f"sequences must be (n, T) with T >= 2, got {tuple(sequences.shape)}")
    if max_sequences is not None:
        sequences = sequences[:max_sequences]
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with eval_mode(model):
        for i in range(0, sequences.shape[0], batch_size):
            batch = sequences[i:i + batch_size].to(device)
            with autocast_to(device, autocast_dtype):
                logits = model(input_ids=batch).logits
            logits = logits[:, :-1].float()
            targets = batch[:, 1:]
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
            total += float(nll.double())
            count += targets.numel()
    return total / count


@torch.no_grad()
def evaluate_loss(
    model: torch.nn.Module,
    data,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] = lm_loss,
    *,
    batch_size: int = 64,
) -> float:
    """Mean of ``loss_fn`` over ``data`` in batches, weighted by batch size, in eval mode.

    ``data`` is laid out as for :func:`train`: a tensor or a tuple of tensors whose first
    dimension indexes examples, e.g. ``(images (n, C, H, W), labels (n,))`` for a
    classifier with ``loss_fn = lambda m, b: F.cross_entropy(m(b[0]), b[1])``.  For a
    loss that is itself a per-example mean (that one, or :func:`lm_loss` on
    equal-length sequences) the result is the mean over all ``n`` examples, in the
    loss's units (nats for cross-entropy), whatever ``batch_size``.  The model's
    train/eval mode is restored afterwards.
    """
    n = data_len(data)
    device = next(model.parameters()).device
    total = 0.0
    with eval_mode(model):
        for i in range(0, n, batch_size):
            idx = torch.arange(i, min(i + batch_size, n))
            total += float(loss_fn(model, take_rows(data, idx, device)).double()) * len(idx)
    return total / n
