"""The capture's one forward and one backward pass: a hook keeps each layer's output z, the per-example losses are
formed, and ``torch.autograd.grad`` of their sum reaches down to the zs only (no parameter gradients).

No parameter records a graph during the forward (:func:`parameters_frozen`): below z nothing needs one (the hook makes
z a leaf of its own when nothing below requires gradients), and above z only the path from the loss to z is
differentiated, which needs no parameter's gradient; so the forward saves no tensor for a weight gradient and the
backward forms none, and q is the same number (the same kernels on the same values; ``tests/test_capture_frozen.py``
checks it bit for bit). ``requires_grad`` is restored exactly afterwards, also on an error or a Ctrl-C.

Refused here, where the graph shows it: a layer that does not run exactly once, an output that is not batch-first,
an in-place change of z after it was produced, non-finite losses, a loss that no gradient links to z.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from dalign_core.capture.batches import call_model
from dalign_core.capture.losses import logits_of, positions_for_left_padding, resolve_task, call_loss, per_example_loss
from dalign_core.capture.refusals import CaptureError

__all__ = ["layer_gradients", "parameters_frozen", "primary_output", "forward_to_losses"]


def _restore_requires_grad(parameters: list[torch.Tensor]) -> None:
    """``requires_grad_(True)`` on each of ``parameters``, all of them even when Ctrl-C lands midway (then re-raised).

    Setting the flag twice is harmless, so an interrupted step is simply retried."""
    interrupted: BaseException | None = None
    done = 0
    while done < len(parameters):
        try:
            while done < len(parameters):
                parameters[done].requires_grad_(True)
                done += 1
        except KeyboardInterrupt as err:
            interrupted = err
    if interrupted is not None:
        raise interrupted


@contextlib.contextmanager
def parameters_frozen(model: nn.Module, keep: Iterable[torch.Tensor] = ()) -> Iterator[None]:
    """Within the block, no parameter of ``model`` but those in ``keep`` requires gradients; afterwards exactly the
    ones that did before do again, also when the block raises or is interrupted (Ctrl-C).

    A forward run inside records no graph for the frozen parameters: nothing is saved for their gradients and a
    backward pass forms none. Tied parameters count once. Not for a model that another thread trains meanwhile.
    """
    kept = {id(p) for p in keep}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in kept]
    try:
        for parameter in frozen:
            parameter.requires_grad_(False)
        yield
    finally:
        _restore_requires_grad(frozen)


def primary_output(output: Any) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """The hidden-state tensor of a module output and a function that rebuilds the output around a replacement."""
    if isinstance(output, torch.Tensor):
        return output, lambda t: t
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0], lambda t: type(output)((t, *output[1:])) if isinstance(output, tuple) else [t, *output[1:]]
    raise CaptureError(
        f"the layer returned {type(output).__name__}, not a tensor or a tuple starting with one; "
        "capture a submodule whose output is the hidden state"
    )


def _in_place_error(names: Sequence[str]) -> CaptureError:
    which = ", ".join(repr(name) for name in names)
    return CaptureError(
        f"an in-place operation modified the output of {which} after it was produced (e.g. relu(..., inplace=True) or "
        "+= on it), so the gradient with respect to it would be taken at the modified tensor and q would be wrong; "
        "capture at another layer (e.g. the block containing that operation) or replace the in-place operation"
    )


def layer_gradients(model, modules: dict[str, nn.Module], inputs, targets, task, loss_fn,
               logits_index: int | None = None) -> dict[str, torch.Tensor]:
    """One forward pass and one backward pass down to the layers' outputs z: ∂(Σ_i ℓ_i)/∂z per layer (z's shape).

    Refuses what :func:`forward_to_losses` refuses, and a layer whose output no gradient path links to the loss.
    """
    zs, losses = forward_to_losses(model, modules, inputs, targets, task, loss_fn, logits_index)
    with torch.enable_grad():
        grads = torch.autograd.grad(losses.sum(), zs, allow_unused=True)
    unreached = [name for name, grad in zip(modules, grads) if grad is None]
    if unreached:
        raise CaptureError(
            f"no gradient reaches the output of {', '.join(map(repr, unreached))}: the loss does not depend on it "
            "through autograd (used only under torch.no_grad(), detached, or not used at all), so q would be "
            "silently 0; capture at a layer the loss depends on with gradients enabled"
        )
    return {name: grad.detach() for name, grad in zip(modules, grads)}


def _capturing_hook(captured: list[tuple[torch.Tensor, int]]):
    """A forward hook that appends the layer's output z (and its version counter) to ``captured``; where z records
    no graph (frozen parameters upstream) it is replaced by a leaf that can be differentiated."""
    def hook(module, args, output):
        tensor, rebuild = primary_output(output)
        replacement = None
        if not tensor.requires_grad:  # e.g. frozen parameters upstream: make z a leaf we can differentiate
            tensor = tensor.detach().requires_grad_(True)
            replacement = rebuild(tensor)
        captured.append((tensor, tensor._version))
        return replacement
    return hook


def _check_ran_once(captured: dict[str, list[tuple[torch.Tensor, int]]]) -> None:
    """Refuse an insertion point that did not run, or ran more than once, in the forward pass."""
    for name, seen in captured.items():
        if len(seen) != 1:
            what = "did not run" if not seen else f"ran {len(seen)} times"
            raise CaptureError(
                f"layer {name!r} {what} in one forward pass; an insertion point must be a submodule that runs "
                "exactly once per forward"
            )


def _checked_losses(model, output, inputs, targets, task, loss_fn, logits_index: int | None) -> torch.Tensor:
    """The per-example losses (batch,) of ``output``: from ``loss_fn``, else from the task's loss on the logits;
    refused unless one-dimensional and finite."""
    if loss_fn is not None:
        losses = call_loss(loss_fn, output, targets)  # its errors and returns checked, coupling refused
    else:  # the task read from the model here, where the model is known
        logits = logits_of(output, logits_index)
        losses = per_example_loss(logits, inputs, targets, resolve_task(model, task, logits))
    if losses.ndim != 1:
        raise CaptureError(f"per-example losses must have shape (batch,), got {tuple(losses.shape)}")
    bad = torch.nonzero(~torch.isfinite(losses.detach())).flatten().tolist()
    if bad:
        raise CaptureError(
            f"non-finite loss for example(s) {bad[:10]} of {losses.shape[0]} "
            f"(values {[float(losses.detach()[i]) for i in bad[:3]]}); check the inputs, targets and the model's dtype"
        )
    return losses


def _check_graph(captured: dict[str, list[tuple[torch.Tensor, int]]], losses: torch.Tensor) -> None:
    """Refuse a z that is not batch-first, a z changed in place after the hook saw it, and losses that record no
    graph (so nothing links them to the zs)."""
    for name, [(z, _)] in captured.items():
        if z.shape[0] != losses.shape[0]:
            raise CaptureError(
                f"layer {name!r} output has leading dimension {z.shape[0]}, the batch has {losses.shape[0]} "
                "examples; the insertion point's output must be batch-first"
            )
    modified = [name for name, [(z, version)] in captured.items() if z._version != version]
    if modified:
        raise _in_place_error(modified)
    if not losses.requires_grad:  # no parameter records a graph, so nothing but the zs can link it
        raise CaptureError(
            f"no gradient reaches the output of {', '.join(map(repr, captured))}: the loss does not depend on "
            f"the output of {list(captured)} through autograd (was the forward, or the part after the layer, "
            "run under torch.no_grad() or on detached tensors?); q would be 0"
        )


def forward_to_losses(model, modules: dict[str, nn.Module], inputs, targets, task, loss_fn,
                      logits_index: int | None = None,
                      keep: Iterable[torch.Tensor] = ()) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One forward pass with gradients on: each layer's output z (in the order of ``modules``) and the per-example
    losses (batch,), ready for backward passes down to the zs (and to the parameters in ``keep``, the only ones
    whose graph is recorded: :func:`parameters_frozen`).

    Refuses what the graph shows would give a wrong gradient: a layer that does not run exactly once, an output that
    is not batch-first, an in-place change of z after the hook saw it (z's version counter moved), non-finite
    losses, and a loss that no gradient path links to any z.
    """
    captured: dict[str, list[tuple[torch.Tensor, int]]] = {name: [] for name in modules}
    handles = []
    try:
        for name, module in modules.items():
            handles.append(module.register_forward_hook(_capturing_hook(captured[name])))
        inputs = positions_for_left_padding(model, inputs, task, loss_fn)
        with torch.enable_grad(), parameters_frozen(model, keep):
            try:
                output = call_model(model, inputs)
            except RuntimeError as err:  # an in-place op on the leaf the hook made for a frozen upstream
                if "leaf Variable that requires grad" in str(err) and "in-place" in str(err):
                    raise _in_place_error([n for n, seen in captured.items() if seen and seen[-1][0].is_leaf]) from err
                raise
            for handle in handles:  # no hook may outlive the forward pass
                handle.remove()
            handles = []
            _check_ran_once(captured)
            losses = _checked_losses(model, output, inputs, targets, task, loss_fn, logits_index)
            _check_graph(captured, losses)
    finally:
        for handle in handles:
            handle.remove()
    return [captured[name][0][0] for name in modules], losses
