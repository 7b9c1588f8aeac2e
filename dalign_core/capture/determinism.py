"""The determinism self-check: a forward that draws random numbers, or whose example 0 alone gives another
gradient than its row of the batch's (batch statistics, dropout applied in an eval-mode model), is refused.
"""

from __future__ import annotations

import math

import torch

from dalign_core.capture.batches import batch_rows, take_first
from dalign_core.capture.gradients import layer_gradients
from dalign_core.capture.refusals import CaptureError

__all__ = ["random_states", "drew_random_numbers", "check_deterministic"]


def _determinism_tolerance(dtype: torch.dtype) -> float:
    """Relative difference of a recomputed gradient above which it is not rounding: 1e-5, or 8 ulps for half precision."""
    return max(1e-5, 8 * torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-5


def random_states() -> list[torch.Tensor]:
    """The states of torch's default random number generators: the CPU one and each initialized CUDA device's."""
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def drew_random_numbers(before: list[torch.Tensor]) -> bool:
    """Whether a default generator moved since ``before`` (:func:`random_states`): something drew random numbers.

    Every random operation in torch (dropout, ``bernoulli_``, ``rand*``) advances its device's generator, whatever
    module or function calls it: the dependable sign that the forward is random, where the module flags miss a
    functional call with ``training=True`` and a recomputation of one example sees a random drop only when it
    happens to differ (stochastic depth of p = 0.1 keeps both copies of an example 81% of the time)."""
    return any(not torch.equal(a, b) for a, b in zip(random_states(), before))  # a device set up since: not compared


def _relative_gap(row: torch.Tensor, again: torch.Tensor) -> float:
    """Largest ``||row - again_k|| / ||row||`` over the rows of ``again`` (``inf`` when row is 0 and they are not)."""
    row, again = row.double(), again.double()
    scale = float(row.norm())
    gap = float((again - row).flatten(1).norm(dim=1).max())
    return gap / scale if scale > 0 else (0.0 if gap == 0 else math.inf)


def _agrees_alone(model, modules, inputs, targets, task, loss_fn, grads: dict[str, torch.Tensor],
                        logits_index, batch: int) -> bool:
    """Whether example 0 alone gives its row of ``grads`` within rounding at every layer."""
    first = [0]
    try:
        again = layer_gradients(model, modules, batch_rows(inputs, batch, first), batch_rows(targets, batch, first), task,
                           loss_fn, logits_index)
    except Exception:  # noqa: BLE001  (the decisive check runs it at full size and says what failed)
        return False
    return all(again[name].shape[1:] == grad.shape[1:] and
               _relative_gap(grad[:1], again[name]) <= _determinism_tolerance(grad.dtype)
               for name, grad in grads.items())


def check_deterministic(model, modules, inputs, targets, task, loss_fn, grads: dict[str, torch.Tensor],
                         logits_index: int | None = None) -> None:
    """Recompute example 0 in a batch of copies of itself and compare its gradient with its row of the batch's.

    A per-example gradient does not depend on the rest of the batch, nor on the run; a forward that draws random
    numbers (dropout applied with ``training=True`` in an eval-mode model) or normalizes with the batch's statistics
    (``F.batch_norm(..., training=True)``) gives a different one — the module-level checks cannot see such calls.

    Cost: first example 0 alone (1/b of a batch's passes: 4% of a capture of 32 x 128 tokens on a CPU). Copies of
    one example have that example's statistics however many there are, so one sees any coupling that b copies see
    (or fails, as ``F.batch_norm`` of a single row does); what differs is the kernels' arithmetic at another batch
    size (rounding, which can flip a ReLU at an exact zero). So example 0 alone agreeing with the batch's row within
    :func:`_determinism_tolerance` passes, and only a disagreement pays for the decisive check: b copies, the
    batch's own kernels (refused there or not, as before). Random draws are caught before, by the generator's
    state (:func:`drew_random_numbers`).
    """
    batch = next(iter(grads.values())).shape[0]
    if batch > 1 and _agrees_alone(model, modules, inputs, targets, task, loss_fn, grads, logits_index, batch):
        return
    try:
        again = layer_gradients(model, modules, take_first(inputs, batch), take_first(targets, batch), task, loss_fn,
                           logits_index)
    except CaptureError:
        raise
    except Exception as err:  # e.g. "Expected more than 1 value per channel when training" from F.batch_norm
        raise CaptureError(
            f"the model is not deterministic in eval mode: dropout or batch statistics in training mode? It ran on "
            f"the batch of {batch} but not on its example 0 alone ({type(err).__name__}: "
            f"{(str(err).splitlines() or [''])[0][:200]}), so its output depends on the rest of the batch; look for "
            "F.batch_norm(..., training=True) in the forward, or pass check_determinism=False if a batch of one "
            "cannot run for another reason"
        ) from err
    for name, grad in grads.items():
        first, alone = grad[:1].double(), again[name][:1].double()
        if alone.shape != first.shape:
            raise CaptureError(
                f"could not check that the model is deterministic: example 0 alone gave an output of shape "
                f"{tuple(alone.shape)} at {name!r}, in the batch {tuple(first.shape)}; pass check_determinism=False "
                "if the inputs are not batch-first"
            )
        scale = float(first.norm())
        diff = float((first - alone).norm())
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        if not rel <= _determinism_tolerance(grad.dtype):
            raise CaptureError(
                f"the model is not deterministic in eval mode: dropout or batch statistics in training mode? "
                f"Example 0's activation gradient at {name!r} differs by {rel:.2g} (relative) between the batch and a "
                "recomputation of it alone, so q is random or couples the examples. Look for F.dropout(..., "
                "training=True) or F.batch_norm(..., training=True) (or other random or batch-coupled operations) "
                "in the forward; nn.Dropout and nn.BatchNorm modules in eval mode are fine"
            )
