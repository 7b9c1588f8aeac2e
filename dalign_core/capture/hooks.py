"""Capture per-example activation gradients q_i = ∂ℓ_i/∂z_i at an insertion point, in one backward pass.

The insertion point is the output ``z`` of a submodule, named by its dotted path as
``model.named_modules()`` prints it (``"model.layers.1"`` for a LLaMA decoder layer,
``"gpt_neox.layers.3"`` for GPT-NeoX, ``"layer2.0"`` for a CIFAR ResNet block).
``ℓ_i`` is example i's own loss: for a causal language model the mean next-token
cross-entropy over its non-padding target tokens, for a masked LM or a token
classifier the mean cross-entropy of its labelled tokens (not shifted), for a
classifier the cross-entropy of its label (or any per-example loss through
``loss_fn``). Which loss is read from the model's class (``task="auto"``) or given
(``task=``); a model with per-token logits that is none of these must say which.

How: a forward hook keeps a reference to ``z`` (the first element when the
module returns a tuple, as some transformers decoder layers do), the model runs
one ordinary forward pass, and ``torch.autograd.grad`` differentiates the *sum*
of the per-example losses with respect to ``z`` only. Because examples do not
interact (per-example normalization: LayerNorm, RMSNorm, BatchNorm with running
statistics), row i of that gradient is exactly ∂ℓ_i/∂z_i. Parameters' ``.grad``
are never touched, and only the part of the backward pass that leads to ``z``
runs (no weight gradients are formed).

Mode policy: the model is used exactly as given; this module never switches it
between train and eval. It *refuses* states that would couple examples or make
the gradient random — a BatchNorm in training mode (or one without running
statistics), active dropout (``nn.Dropout`` with p > 0 in training mode, or a
module's or config's attention dropout > 0 in training mode), any other module in
training mode that drops at random (a drop probability ``p``, ``drop_prob``, … in (0, 1]:
torchvision's ``StochasticDepth``, timm's ``DropPath``; ``nn.RReLU``) — so call
``model.eval()`` first (that is what the ``dalign`` command does). A dropout-free,
BatchNorm-free model may be captured in training mode. The model is left exactly
as it was — no hooks, no parameter, ``requires_grad`` or mode change — also when
an error is raised.

What the module state cannot show, the graph does, and capture refuses it rather
than return a silently wrong q: an in-place operation on ``z`` after the layer
produced it (its version counter moved during the forward, as after
``F.relu(z, inplace=True)``), a loss that no gradient links to ``z`` (only through
``torch.no_grad()`` or ``.detach()``: no zero rows are made up), a ``torch.compile``d
model (capture on ``model._orig_mod``), and — with ``check_determinism=True``, on the
first batch — a forward that draws random numbers (torch's random generator moves
during it) or normalizes with batch statistics (the first example recomputed alone
differs) although the modules are in eval mode (``F.dropout(..., training=True)``,
``F.batch_norm(..., training=True)``).

Padding: positions with ``attention_mask == 0`` are left out of every loss, also the
next-token pair that starts at one; a left-padded batch gets the ``position_ids`` that
number each example's tokens from 0 (as transformers' ``generate`` does) for a causal
LM's loss, and is refused otherwise (pad on the right, or pass ``position_ids``).

Cost: the causal-LM loss reads the logits as the model returns them (labels are
shifted, not the logits), so the capture adds no copy of the ``(batch, T, V)``
logits to a forward and a backward down to ``z``.

Shapes: ``reduction="shared"`` sums over positions — tokens for a 3-D output
``(batch, tokens, features)``, the spatial dims for a ≥4-D output ``(batch, channels,
*spatial)`` — giving the gradient of a zero-initialized residual bias shared over
positions (dimension N or C). ``reduction="full"`` keeps every position (T·N or
C·H·W, flattened in the output's memory order). A 2-D output ``(batch, d)`` is
returned as is by both.

Batches for the iterator forms are any of: a ``Mapping`` (e.g. a tokenizer's
``BatchEncoding`` with ``input_ids``/``attention_mask``, optionally ``labels``),
a tensor of inputs, or a pair ``(inputs, targets)``.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from dalign_core.capture.batches import (
    check_batch,
    check_batches,
    is_positive_int,
    conform_batch,
    split_batch,
    targets_from_labels,
)
from dalign_core.capture.determinism import check_deterministic, drew_random_numbers, random_states
from dalign_core.capture.gradients import layer_gradients
from dalign_core.capture.layers import check_sequence_first, resolve_layers
from dalign_core.capture.losses import TASKS, LossFn
from dalign_core.capture.refusals import CaptureError, check_model, describe, check_capturable, check_not_compiled
from dalign_core.geometry.accumulator import GeometryAccumulator

__all__ = ["REDUCTIONS", "activation_gradients", "iter_activation_gradients", "accumulate_geometry",
           "reduce_gradient", "check_options"]


REDUCTIONS = ("shared", "full")


def check_options(reduction: Any, task: Any, loss_fn: Any, logits_index: Any = None) -> None:
    """Raise CaptureError naming the first of ``reduction``, ``task``, ``loss_fn``, ``logits_index`` that is not
    valid."""
    if reduction not in REDUCTIONS:
        raise CaptureError(f"reduction must be one of {REDUCTIONS}, got {describe(reduction)}")
    if task not in TASKS:
        raise CaptureError(f"task must be one of {TASKS}, got {describe(task)}")
    if loss_fn is not None and not callable(loss_fn):
        raise CaptureError(f"loss_fn must be a function (output, targets) -> per-example losses, got {describe(loss_fn)}")
    if logits_index is not None and (not isinstance(logits_index, numbers.Integral) or isinstance(logits_index, bool)):
        raise CaptureError(f"logits_index must be an int (the position of the logits in the model's output tuple) or "
                           f"None, got {describe(logits_index)}")


def _check_flag(check_determinism: Any) -> None:
    if not isinstance(check_determinism, bool):
        raise CaptureError(f"check_determinism must be True or False, got {describe(check_determinism)}")


def reduce_gradient(grad: torch.Tensor, reduction: str) -> torch.Tensor:
    if grad.dtype in (torch.float16, torch.bfloat16):
        grad = grad.float()
    b = grad.shape[0]
    if grad.ndim <= 2:
        return grad.reshape(b, -1)
    if reduction == "full":
        return grad.reshape(b, -1)
    if grad.ndim == 3:  # (batch, positions, features)
        return grad.sum(dim=1)
    return grad.sum(dim=tuple(range(2, grad.ndim)))  # (batch, channels, *spatial)


def _capture(model, modules: dict[str, nn.Module], inputs, targets, reductions: tuple[str, ...], task, loss_fn,
             check_determinism: bool = False, logits_index: int | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """One forward and one backward pass; reduction → layer name → (batch, d) rows, every reduction from one gradient.

    The public callers have checked the reductions, task and loss (:func:`check_options`)."""
    check_capturable(model)
    check_sequence_first(modules)
    targets = targets_from_labels(inputs, targets)
    check_batch(model, inputs, targets, loss_fn)
    inputs, targets = conform_batch(model, inputs, targets)
    before = random_states() if check_determinism else None
    grads = layer_gradients(model, modules, inputs, targets, task, loss_fn, logits_index)
    if before is not None and drew_random_numbers(before):
        raise CaptureError(
            "the model is not deterministic in eval mode: dropout or batch statistics in training mode? Its forward "
            "drew random numbers (torch's random number generator moved during the capture), so q is random: look "
            "for F.dropout(..., training=True), a random drop (stochastic depth) or torch.rand*/bernoulli in the "
            "forward; nn.Dropout modules in eval mode are fine"
        )
    out: dict[str, dict[str, torch.Tensor]] = {reduction: {} for reduction in reductions}
    for name, grad in grads.items():
        for reduction in reductions:
            rows = reduce_gradient(grad, reduction)
            bad_rows = torch.nonzero(~torch.isfinite(rows).all(dim=1)).flatten().tolist()
            if bad_rows:
                raise CaptureError(f"non-finite activation gradient at {name!r} for example(s) {bad_rows[:10]}")
            out[reduction][name] = rows
    if check_determinism:
        check_deterministic(model, modules, inputs, targets, task, loss_fn, grads, logits_index)
    return out


def _captures(model, modules: dict[str, nn.Module], batches: Iterable[Any], reductions: tuple[str, ...], task, loss_fn,
              check_determinism: bool, logits_index: int | None = None) -> Iterator[dict[str, dict[str, torch.Tensor]]]:
    """:func:`_capture` of each batch in turn (``check_determinism`` on the first batch only)."""
    for index, batch in enumerate(batches):
        inputs, targets = split_batch(batch)
        yield _capture(model, modules, inputs, targets, reductions, task, loss_fn, check_determinism and index == 0,
                       logits_index)


def _reductions(reduction: Any) -> tuple[str, ...]:
    """``"shared"`` → ``("shared",)``; a list or tuple of reductions → a tuple of distinct ones, each checked."""
    if isinstance(reduction, str) or not isinstance(reduction, (list, tuple)):
        return (reduction,)
    if not reduction or len(set(reduction)) != len(reduction):
        raise CaptureError(f"reduction must be one of {REDUCTIONS} or a list of distinct ones, got {describe(reduction)}")
    return tuple(reduction)


def _checked_call(model, layer, reduction, task, loss_fn, logits_index, check_determinism: Any,
                  several: bool = False) -> tuple[dict[str, nn.Module], tuple[str, ...]]:
    """What every public capture function checks first, in this order: the model (a module, not compiled: a
    compiled model's names are prefixed with "_orig_mod."), the layers (resolved to submodules), the reduction
    (``several``: a list of them is allowed), task, loss and logits index, and the determinism flag. Returns the
    modules by name and the reductions."""
    check_model(model)
    check_not_compiled(model)  # before the names: a compiled model's are prefixed with "_orig_mod."
    modules = resolve_layers(model, layer)
    reductions = _reductions(reduction) if several else (reduction,)
    for each in reductions:
        check_options(each, task, loss_fn, logits_index)
    _check_flag(check_determinism)
    return modules, reductions


def _progress_bar(progress: bool, examples: int | None, desc: str):
    """A tqdm bar over ``examples`` examples labelled ``desc``, or None without ``progress``."""
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=examples, desc=desc, unit="ex", leave=False)


def _stream(captures: Iterable[dict[str, dict[str, torch.Tensor]]],
            accumulators: dict[str, dict[str, GeometryAccumulator]], examples: int | None, bar) -> None:
    """Feed each batch's rows (reduction → layer → (batch, d)) to ``accumulators`` until ``examples`` rows (all,
    for None) have gone in; the last batch is truncated. Closes ``bar`` (if any) at the end."""
    seen = 0
    try:
        for captured in captures:
            batch_size = len(next(iter(next(iter(captured.values())).values())))
            take = batch_size if examples is None else min(examples - seen, batch_size)
            for each, rows in captured.items():
                for name, batch_rows in rows.items():
                    # The accumulator keeps its first batch's dtype: never a half-precision one (q is formed in
                    # float32 from half-precision gradients already; this holds the line should that change).
                    if batch_rows.dtype in (torch.float16, torch.bfloat16):
                        batch_rows = batch_rows.float()
                    accumulators[each][name].update(batch_rows if take == batch_size else batch_rows[:take])
            seen += take
            if bar is not None:
                bar.update(take)
            if examples is not None and seen >= examples:
                break
    finally:
        if bar is not None:
            bar.close()


def activation_gradients(
    model: nn.Module,
    layer: str | Sequence[str],
    inputs: Any,
    targets: Any = None,
    reduction: str = "shared",
    *,
    task: str = "auto",
    loss_fn: LossFn | None = None,
    check_determinism: bool = True,
    logits_index: int | None = None,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Per-example activation gradients at ``layer`` from one forward and one backward pass.

    Args:
        model: any ``nn.Module``; runs on its own device (inputs are moved there).
        layer: a dotted submodule name, a list of names, or ``"all"`` (every residual block).
        inputs: what the model takes: a tensor, or a mapping of keyword arguments
            (``input_ids``, ``attention_mask``, …) for transformers models.
        targets: labels for a classifier; for a causal LM, optional ``labels`` in the
            transformers convention (default: the input ids; padding ignored). A
            ``labels`` entry of a mapping ``inputs`` is used the same way (its ``-100``
            positions are left out of the loss); give labels one way only.
        reduction: ``"shared"`` (sum over positions) or ``"full"`` (keep positions).
        task: ``"auto"``: 2-D logits → classifier; 3-D logits → read from the model's class
            (a transformers ``…ForCausalLM``/``…LMHeadModel`` → ``"causal_lm"``, ``…ForMaskedLM`` or
            ``…ForTokenClassification`` → the unshifted per-token loss), refused for any other
            model. Or explicitly ``"causal_lm"`` (position t predicts token t+1; refused for a model
            whose attention is bidirectional), ``"masked_lm"``/``"token_classification"`` (each
            position its own label, ``-100`` ignored), ``"classification"``.
        loss_fn: ``loss_fn(output, targets) -> (batch,)`` per-example losses, overriding ``task``.
        logits_index: where the logits are in a model output that is a tuple of several
            tensors (e.g. ``1`` for ``(features, logits)``); such an output is refused without it.
        check_determinism: refuse a forward that draws random numbers (torch's random
            generator moves during it) or uses batch statistics despite eval mode (example 0
            recomputed alone differs from its row of the batch's by more than rounding; only
            then is it recomputed among copies of itself at the batch's size, to decide).
            Costs one extra forward and backward of one example.

    Returns:
        A ``(batch, d)`` tensor (float32 for half-precision models) whose row i is
        ∂ℓ_i/∂z_i; a dict name → tensor when ``layer`` is a list or ``"all"``.

    Raises:
        CaptureError: unknown layer, BatchNorm in training mode, active dropout,
            non-finite loss or gradient, a layer that does not run exactly once, an
            in-place operation on the layer output after it was produced, a loss that no
            gradient links to the layer output (``torch.no_grad()``, ``.detach()``), a
            ``torch.compile``d model, a forward that is random or couples the examples
            (``check_determinism``), and arguments of the wrong type (a layer that is not
            a name, float ``input_ids``, token ids outside the embedding); it is a ``ValueError``.
    """
    modules, _ = _checked_call(model, layer, reduction, task, loss_fn, logits_index, check_determinism)
    rows = _capture(model, modules, inputs, targets, (reduction,), task, loss_fn, check_determinism,
                    logits_index)[reduction]
    if isinstance(layer, str) and layer != "all":
        return rows[layer]
    return rows


def iter_activation_gradients(
    model: nn.Module,
    layer: str | Sequence[str],
    batches: Iterable[Any],
    *,
    reduction: str = "shared",
    task: str = "auto",
    loss_fn: LossFn | None = None,
    check_determinism: bool = True,
    logits_index: int | None = None,
) -> Iterator[torch.Tensor | dict[str, torch.Tensor]]:
    """Yield :func:`activation_gradients` for each batch (one forward+backward per batch).

    Each batch is a tensor, a mapping, or a pair ``(inputs, targets)``; the other arguments are
    :func:`activation_gradients`'. Hooks live only
    during each batch's forward pass, so abandoning the iterator leaves the model clean.
    ``check_determinism`` checks the first batch only (one extra example's passes).
    """
    modules, _ = _checked_call(model, layer, reduction, task, loss_fn, logits_index, check_determinism)
    check_batches(batches)  # fail before the first batch
    single = isinstance(layer, str) and layer != "all"
    for captured in _captures(model, modules, batches, (reduction,), task, loss_fn, check_determinism, logits_index):
        rows = captured[reduction]
        yield rows[next(iter(modules))] if single else rows


def accumulate_geometry(
    model: nn.Module,
    layer: str | Sequence[str],
    batches: Iterable[Any],
    *,
    examples: int | None = None,
    reduction: str | Sequence[str] = "shared",
    task: str = "auto",
    loss_fn: LossFn | None = None,
    check_determinism: bool = True,
    logits_index: int | None = None,
    sketch_dim: int | None = None,
    seed: int = 0,
    device=None,
    progress: bool = False,
    desc: str = "capturing q",
) -> GeometryAccumulator | dict[str, GeometryAccumulator]:
    """Stream activation gradients into one :class:`GeometryAccumulator` per layer.

    Several layers (a list, or ``"all"``) share each forward and backward pass, and so do
    several reductions (``reduction=("full", "shared")``): q of every reduction is a
    function of the same gradient ∂ℓ_i/∂z_i. At most ``examples`` rows are used (the
    last batch is truncated); the q rows are not kept beyond what the accumulator keeps
    (with ``sketch_dim=k`` only k-dim sketches). Call ``.result(confidence)`` on an
    accumulator for the :class:`Geometry`.

    Returns:
        The accumulator, or a dict name → accumulator for a list of layers or ``"all"``;
        for a list of reductions, a dict reduction → that.
    """
    modules, reductions = _checked_call(model, layer, reduction, task, loss_fn, logits_index, check_determinism,
                                        several=True)
    check_batches(batches)
    single = isinstance(layer, str) and layer != "all"
    if examples is not None and not is_positive_int(examples):
        raise CaptureError(f"examples must be a positive int (a number of examples) or None, got {describe(examples)}")
    if sketch_dim is not None and not is_positive_int(sketch_dim):
        raise CaptureError(f"sketch_dim must be a positive int or None, got {describe(sketch_dim)}")
    accumulators = {
        each: {name: GeometryAccumulator(sketch_dim=sketch_dim, seed=seed, device=device) for name in modules}
        for each in reductions
    }
    captures = _captures(model, modules, batches, reductions, task, loss_fn, check_determinism, logits_index)
    _stream(captures, accumulators, examples, _progress_bar(progress, examples, desc))
    shaped = {each: by_layer[next(iter(modules))] if single else by_layer for each, by_layer in accumulators.items()}
    return shaped[reduction] if isinstance(reduction, str) else shaped
