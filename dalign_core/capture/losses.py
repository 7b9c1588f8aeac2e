"""Which loss each example's gradient is of: causal LM (next token), masked LM and token classification (each
position its own label), classification, or a given ``loss_fn``; padding left out, and left padding positioned.

``task="auto"`` reads the problem from the model's class (:func:`per_example_loss`); a next-token loss of a model
whose attention is bidirectional is refused (:func:`causal_lm_problem`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dalign_core.capture.batches import as_long, forward_params
from dalign_core.capture.refusals import CaptureError, ModelError, describe, first_line, user_frame

__all__ = ["IGNORE_INDEX", "TASKS", "LossFn", "per_example_loss", "causal_lm_problem", "call_loss",
           "check_losses_separate", "logits_of", "positions_for_left_padding", "resolve_task"]


IGNORE_INDEX = -100
"""Target value ignored by the causal-LM loss (the transformers convention)."""
TASKS = ("auto", "causal_lm", "masked_lm", "token_classification", "classification")

LossFn = Callable[[Any, Any], torch.Tensor]


def logits_of(output: Any, logits_index: int | None = None) -> torch.Tensor:
    """The logits in a model output: the output itself (a tensor), its ``.logits``, or the one tensor of a tuple.

    A tuple or list holding several tensors (``(features, logits)``) is ambiguous: which one the logits are is
    said by ``logits_index``, never guessed (taking the first would score the features as logits)."""
    if logits_index is not None:
        if not isinstance(output, (tuple, list)) or not -len(output) <= logits_index < len(output) \
                or not isinstance(output[logits_index], torch.Tensor):
            raise CaptureError(
                f"logits_index={logits_index} does not name a tensor in the model output ({describe(output)}); "
                "pass the position of the logits in the tuple the model returns, or logits_index=None for a model "
                "that returns the logits alone (or an output with .logits)"
            )
        return output[logits_index]
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)):
        tensors = [i for i, item in enumerate(output) if isinstance(item, torch.Tensor)]
        if len(tensors) == 1:
            return output[tensors[0]]
        if len(tensors) > 1:
            shapes = ", ".join(f"[{i}] {tuple(output[i].shape)}" for i in tensors[:4])
            raise CaptureError(
                f"the model returns a {type(output).__name__} of {len(tensors)} tensors ({shapes}), so which one is "
                "the logits is ambiguous; pass logits_index=<its position> (or loss_fn=(output, targets) -> "
                "per-example losses), or wrap the model so that it returns the logits alone (as --arch needs)"
            )
    raise CaptureError(
        f"cannot find logits in the model output of type {type(output).__name__}; pass loss_fn=(output, targets) -> "
        "per-example losses of shape (batch,)"
    )


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits in float32 for the loss; float32 and float64 logits keep their precision."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _check_label_range(labels: torch.Tensor, classes: int, what: str, ignore: bool) -> None:
    """Refuse labels outside ``0..classes-1`` (``-100`` allowed where ``ignore``), as token ids are refused."""
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.numel() == 0:
        return
    scored = labels[labels != IGNORE_INDEX] if ignore else labels
    if scored.numel() == 0:
        return
    low, high = int(scored.min()), int(scored.max())
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        raise CaptureError(
            f"{what} hold {bad}, outside the model's {classes} outputs (0..{classes - 1}"
            + (", or -100 where ignored" if ignore else "") + "); pass labels of this model's classes or vocabulary"
        )


def _class_names(model: nn.Module) -> list[str]:
    return [cls.__name__ for cls in type(model).__mro__]


def _causal_lm_class_names() -> set[str]:
    """transformers' causal-LM classes (``AutoModelForCausalLM``'s table), by class name."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # pragma: no cover - transformers is a dependency
        return set()
    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return names


def _is_transformers_model(model: nn.Module) -> bool:
    return any(cls.__module__.startswith("transformers.") for cls in type(model).__mro__)


def _hf_loss_kind(model: nn.Module) -> str:
    """``"token"`` for a transformers masked-LM or token classifier, ``"causal_lm"`` for a causal-LM class or a
    model whose ``dalign_task`` says ``"causal_lm"``, else ""."""
    if getattr(model, "dalign_task", None) == "causal_lm":
        return "causal_lm"
    if not _is_transformers_model(model):
        return ""
    names = _class_names(model)
    if any(name.endswith(("ForMaskedLM", "ForTokenClassification")) for name in names):
        return "token"
    causal = _causal_lm_class_names()
    if any(name in causal or name.endswith(("ForCausalLM", "LMHeadModel")) for name in names):
        return "causal_lm"
    return ""


def causal_lm_problem(model: nn.Module) -> str:
    """Why a next-token loss of ``model`` would be wrong ("" when nothing says so): its attention is bidirectional.

    Read from the model's attention modules: transformers' attention layers carry ``is_causal`` (an encoder such
    as BERT loaded as ``BertLMHeadModel`` without ``is_decoder=True`` has none that is True: every position sees
    the tokens after it, so its next-token prediction reads the answer); without such flags, their ``is_decoder``
    flags. A model with neither (a recurrent or state-space decoder, a plain module) is taken as it is.
    """
    flags = [m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)]
    if not flags:
        flags = [m.is_decoder for m in model.modules() if isinstance(getattr(m, "is_decoder", None), bool)]
    if not flags or any(flags):
        return ""
    config = getattr(model, "config", None)
    hint = " (an encoder: set config.is_decoder=True only if it was trained as a decoder)" \
        if getattr(config, "is_decoder", None) is False else ""
    return (f"{type(model).__name__} attends in both directions{hint}: every position sees the tokens after it, so "
            "a next-token loss would score predictions that read the answer")


def resolve_task(model: nn.Module | None, task: str, logits: torch.Tensor) -> str:
    """The loss ``task`` means for ``model`` and its logits: ``"auto"`` read from the model, refused when unclear.

    2-D logits: a classifier. 3-D logits: a transformers masked-LM or token classifier scores each token as it is,
    a transformers causal LM the next token, as does a model whose ``dalign_task`` attribute says ``"causal_lm"``
    (the command's own LLaMA, :mod:`dalign_core.cli.llama`); any other model must say which (``task=``): shifting
    the labels of a token classifier, or not shifting those of a causal LM, would give a silently wrong q. A
    next-token loss of a model whose attention is bidirectional is refused (:func:`causal_lm_problem`).
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task == "auto":
        if logits.ndim == 2:
            return "classification"
        if logits.ndim != 3:
            raise CaptureError(f"cannot tell the task from logits of shape {tuple(logits.shape)}; pass task= or loss_fn=")
        if model is None:  # per_example_loss without a model: the logits alone (its documented rule)
            return "causal_lm"
        kind = _hf_loss_kind(model)
        if not kind:
            raise CaptureError(
                f"{type(model).__name__} returns per-token logits {tuple(logits.shape)} and is not a transformers "
                "causal-LM, masked-LM or token-classification model, so whether its labels are next tokens is "
                "unknown; pass task='causal_lm' (position t predicts token t+1) or task='token_classification' "
                "(position t predicts its own label; also task='masked_lm')"
            )
        task = "masked_lm" if kind == "token" else "causal_lm"
    if task == "causal_lm" and model is not None:
        problem = causal_lm_problem(model)
        if problem:
            raise CaptureError(f"{problem}; capture it with task='masked_lm' and masked-LM labels, or use a causal LM")
    return task


def per_example_loss(output: Any, inputs: Any, targets: Any = None, task: str = "auto", *,
                     model: nn.Module | None = None, logits_index: int | None = None) -> torch.Tensor:
    """Per-example losses ``(batch,)`` from a model output.

    * ``causal_lm`` (logits ``(b, T, V)``): mean next-token cross-entropy over each
      example's target tokens. ``targets`` follow the transformers ``labels``
      convention (aligned with the inputs, shifted here, ``-100`` ignored); the
      default is the input ids. Positions with ``attention_mask == 0`` are ignored:
      their labels, and the pairs that start at one (with left padding, the last pad
      followed by the first real token).
    * ``masked_lm`` or ``token_classification`` (logits ``(b, T, C)``, labels ``(b, T)``,
      ``-100`` where ignored): mean cross-entropy of each position's own label, not
      shifted, over the example's labelled non-padding positions.
    * ``classification`` (logits ``(b, C)``): cross-entropy of each example's label
      (class indices ``(b,)`` or class probabilities ``(b, C)``).

    The loss is computed in the logits' precision (half precision in float32).
    ``task="auto"``: 2-D logits are a classifier's; 3-D logits are read from ``model``
    (a transformers causal LM, masked LM or token classifier; refused for others), or
    taken as a causal LM's when no ``model`` is given. ``logits_index``: the position
    of the logits in a model output that is a tuple of several tensors.
    """
    logits = logits_of(output, logits_index)
    task = resolve_task(model, task, logits)
    if task == "classification":
        return _classification_loss(logits, targets)
    if task in ("masked_lm", "token_classification"):
        return _token_loss(logits, inputs, targets, task)
    return _causal_lm_loss(logits, inputs, targets)


def _classification_loss(logits: torch.Tensor, targets: Any) -> torch.Tensor:
    """Each example's cross-entropy against its class index ``(b,)`` or class probabilities ``(b, C)``."""
    if targets is None:
        raise CaptureError("a classifier needs targets (the labels of the batch) to define each example's loss")
    _check_classification_targets(logits, targets)
    logits = _at_least_float32(logits)
    if isinstance(targets, torch.Tensor) and targets.is_floating_point():  # class probabilities
        targets = targets.to(logits.dtype)
    elif isinstance(targets, torch.Tensor) and logits.ndim == 2:
        _check_label_range(targets, logits.shape[-1], "targets (class labels)", ignore=False)
    return F.cross_entropy(logits, as_long(targets), reduction="none")


def _causal_lm_labels(inputs: Any, targets: Any, mask: torch.Tensor | None) -> torch.Tensor:
    """The causal LM's unshifted labels ``(b, T)``: ``targets`` (default: the input ids), padding ignored."""
    if targets is None:
        ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else inputs
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point():
            raise CaptureError("a causal LM needs integer input_ids (or explicit targets) to define next-token losses")
        targets = ids
    elif not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        raise CaptureError(
            f"causal-LM targets (labels) must be an integer tensor of token ids, -100 where ignored; got {describe(targets)}"
        )
    labels = as_long(targets)
    if mask is not None:
        labels = labels.masked_fill(mask.to(labels.device) == 0, IGNORE_INDEX)
    return labels


def _causal_lm_loss(logits: torch.Tensor, inputs: Any, targets: Any) -> torch.Tensor:
    """Each example's mean next-token cross-entropy over its scored positions (see :func:`per_example_loss`)."""
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    labels = _causal_lm_labels(inputs, targets, mask)
    if logits.ndim == 3:
        _check_label_range(labels, logits.shape[-1], "causal-LM labels", ignore=True)
    if logits.ndim != 3 or labels.shape != logits.shape[:2]:
        raise CaptureError(f"causal-LM targets of shape {tuple(labels.shape)} do not match logits {tuple(logits.shape)}")
    # Position t is scored against token t + 1 and the last position against nothing (IGNORE_INDEX): the labels
    # are shifted, not the logits. Cross-entropy then reads the (batch, T, V) logits as they are — no slice, so no
    # copy of them forward and no zero-filled (batch, T, V) gradient for a slice backward — and an ignored position
    # contributes exactly 0 to the loss and to the logits' gradient. Each scored token's loss and gradient are
    # bit-identical to cross-entropy on the sliced logits[:, :-1].
    shifted = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), IGNORE_INDEX)], dim=1)
    if mask is not None:  # a padding position predicts nothing (left padding: the last pad precedes a real token)
        shifted = shifted.masked_fill(mask.to(shifted.device) == 0, IGNORE_INDEX)
    token_loss = F.cross_entropy(
        _at_least_float32(logits).flatten(0, 1), shifted.flatten(), ignore_index=IGNORE_INDEX, reduction="none",
    ).view(shifted.shape)[:, :-1].contiguous()  # the T - 1 scored positions, summed below as before
    counts = (shifted[:, :-1] != IGNORE_INDEX).sum(dim=1)
    empty = torch.nonzero(counts == 0).flatten().tolist()
    if empty:
        raise CaptureError(
            f"example(s) {empty[:10]} have no target token (fewer than 2 non-padding tokens), so their loss is undefined; "
            "drop them"
        )
    return token_loss.sum(dim=1) / counts


def _check_classification_targets(logits: torch.Tensor, targets: Any) -> None:
    """Refuse classifier targets cross-entropy would misread or fail on inside torch: logits that are not
    (batch, classes), targets that are neither class indices (batch,) nor class probabilities (batch, classes)."""
    if logits.ndim != 2:
        raise CaptureError(
            f"a classification loss needs logits of shape (batch, classes), got {tuple(logits.shape)}; for per-token "
            "logits pass task='token_classification', 'masked_lm' or 'causal_lm'"
        )
    if not isinstance(targets, torch.Tensor):
        raise CaptureError(f"classifier targets must be a tensor of class indices (batch,), got {describe(targets)}")
    batch, classes = logits.shape
    if targets.dtype == torch.bool or targets.is_complex():
        raise CaptureError(f"classifier targets must be class indices (an integer tensor of shape ({batch},)) or "
                           f"class probabilities (float, ({batch}, {classes})), got {describe(targets)}")
    if targets.is_floating_point():
        if tuple(targets.shape) != (batch, classes):
            hint = "; whole-number class labels: convert them with .long()" if targets.ndim == 1 else ""
            raise CaptureError(
                f"float classifier targets are read as class probabilities and must have the logits' shape "
                f"({batch}, {classes}), got {tuple(targets.shape)}{hint}"
            )
        return
    if tuple(targets.shape) != (batch,):
        hint = "; squeeze the extra axis: targets.view(-1)" if targets.numel() == batch else ""
        raise CaptureError(f"classifier targets must be class indices of shape ({batch},), one per example, got "
                           f"shape {tuple(targets.shape)}{hint}")


def _token_loss(logits: torch.Tensor, inputs: Any, targets: Any, task: str) -> torch.Tensor:
    """Mean cross-entropy of each position's own label (masked LM, token classification): ``(b, T, C)`` → ``(b,)``."""
    what = "masked-LM labels" if task == "masked_lm" else "token labels"
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        raise CaptureError(
            f"{task} needs {what}: an integer tensor (batch, T) aligned with the inputs, -100 where a position is "
            f"not scored (as transformers' labels); got {describe(targets)}"
        )
    labels = as_long(targets)
    if logits.ndim != 3 or labels.shape != logits.shape[:2]:
        raise CaptureError(f"{what} of shape {tuple(labels.shape)} do not match logits {tuple(logits.shape)}")
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if mask is not None:
        labels = labels.masked_fill(mask.to(labels.device) == 0, IGNORE_INDEX)
    _check_label_range(labels, logits.shape[-1], what, ignore=True)
    token_loss = F.cross_entropy(
        _at_least_float32(logits).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none",
    ).view(labels.shape)
    counts = (labels != IGNORE_INDEX).sum(dim=1)
    empty = torch.nonzero(counts == 0).flatten().tolist()
    if empty:
        raise CaptureError(f"example(s) {empty[:10]} have no labelled non-padding position, so their loss is "
                           "undefined; drop them")
    return token_loss.sum(dim=1) / counts


def _left_padded(inputs: Any) -> bool:
    """True when some example of a token batch starts with padding (its attention mask starts with 0)."""
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2 or mask.shape[1] < 2:
        return False
    real = mask != 0
    return bool((~real[:, 0] & real.any(dim=1)).any())


def positions_for_left_padding(model: nn.Module, inputs: Any, task: str, loss_fn: Any) -> Any:
    """A left-padded batch with the ``position_ids`` that place each example's tokens at 0, 1, 2, …

    Without them a transformers model numbers the positions of the padded row from its first pad, so its tokens
    sit at shifted positions (absolute position embeddings read other rows; the loss would not be the example's
    own). This is what transformers' ``generate`` passes for a left-padded batch. Done for a causal LM's
    next-token loss, the case left padding is made for; any other left-padded batch without ``position_ids`` is
    refused (the model's own convention, e.g. RoBERTa's offset positions, is not known here). Right-padded
    batches and batches that carry ``position_ids`` are returned as they are.
    """
    if not _left_padded(inputs) or inputs.get("position_ids") is not None:
        return inputs
    causal = loss_fn is None and (task == "causal_lm" or task == "auto" and _hf_loss_kind(model) == "causal_lm")
    if not causal or "position_ids" not in forward_params(model):
        why = "takes no position_ids" if causal else "is not captured with a causal LM's next-token loss"
        raise CaptureError(
            f"the batch is left-padded (an attention_mask row starts with 0) and {type(model).__name__} {why}, so "
            "its tokens would sit at shifted positions; pad on the right (tokenizer.padding_side = 'right'), or "
            "pass position_ids in the batch"
        )
    real = (inputs["attention_mask"] != 0).long()
    return {**inputs, "position_ids": (real.cumsum(dim=1) - 1).clamp(min=0)}


def call_loss(loss_fn: LossFn, output: Any, targets: Any, batch: int | None = None) -> torch.Tensor:
    """``loss_fn(output, targets)``: its exceptions as a :class:`~dalign_core.capture.refusals.ModelError`, and
    what it returns checked: a floating tensor of shape (batch,) (``batch``: the examples, when known) whose
    example i depends on example i's output alone (:func:`check_losses_separate`)."""
    try:
        losses = loss_fn(output, targets)
    except CaptureError:
        raise
    except Exception as err:  # noqa: BLE001  (the user's loss: any type it raises is its own)
        frame = user_frame(err.__traceback__)
        raise ModelError(
            f"loss_fn raised {type(err).__name__}" + (f" at {frame}" if frame else "") + f": {first_line(err)}; it "
            f"is called as loss_fn(output, targets) with the model's output ({describe(output)}) and the targets "
            f"({describe(targets)}), and must return the per-example losses (batch,)",
            model="loss_fn", kind=type(err).__name__, place="in loss_fn" + (f" at {frame}" if frame else ""),
            detail=first_line(err),
        ) from err
    if not isinstance(losses, torch.Tensor):
        raise CaptureError(f"loss_fn must return a tensor of per-example losses (batch,), got {describe(losses)}")
    if not losses.is_floating_point():
        raise CaptureError(f"loss_fn must return floating per-example losses (batch,), got {describe(losses)}; a "
                           "loss that is an integer has no gradient")
    if losses.ndim != 1 or (batch is not None and losses.shape[0] != batch):
        want = f"({batch},)" if batch is not None else "(batch,)"
        raise CaptureError(f"per-example losses must have shape {want}, one per example, got {tuple(losses.shape)}"
                           + ("; use reduction='none'" if losses.ndim == 0 else ""))
    check_losses_separate(loss_fn, output, targets, losses)
    return losses


def _with_leaves(value: Any, batch: int, leaves: list[torch.Tensor]) -> Any:
    """``value`` (a model output) rebuilt with each floating tensor whose first axis is the ``batch`` examples
    replaced by a detached copy that requires grad (collected in ``leaves``); raises TypeError when a container
    cannot be rebuilt."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.ndim and value.shape[0] == batch:
            leaf = value.detach().requires_grad_(True)
            leaves.append(leaf)
            return leaf
        return value.detach()
    if isinstance(value, Mapping):
        items = {k: _with_leaves(v, batch, leaves) for k, v in value.items()}
        return items if type(value) is dict else type(value)(**items)  # transformers' ModelOutput takes keywords
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_with_leaves(v, batch, leaves) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_with_leaves(v, batch, leaves) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _with_leaves(getattr(value, f.name), batch, leaves)
                                             for f in dataclasses.fields(value) if f.init})
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    raise TypeError(type(value).__name__)


SEPARATION_TOLERANCE = 1e-3
"""Relative size of ``∇(Σ w_i ℓ_i) − w ⊙ ∇(Σ ℓ_i)`` above which a loss couples the examples (rounding: ~1e-7)."""


def check_losses_separate(loss_fn: LossFn, output: Any, targets: Any, losses: torch.Tensor) -> None:
    """Refuse a ``loss_fn`` whose example i's loss depends on other examples' outputs.

    One backward pass of ``Σ_i ℓ_i`` gives each example's own gradient only when ℓ_i depends on output row i
    alone. With ``ℓ_i = l_i − mean(l)`` every q is exactly 0, and with any batch statistic in the loss each row
    mixes the others'. The test: the loss is evaluated again on detached copies of the output's batch-first
    tensors, and the gradient of ``Σ w_i ℓ_i`` (fixed random weights w) must equal ``w_j`` times row j of the
    gradient of ``Σ ℓ_i`` for every example j — exactly what a separable loss gives, and what a coupled one does
    not. Costs two backward passes through the loss alone (not the model). An output that cannot be rebuilt, or a
    loss that does not read it, is not judged here.
    """
    batch = losses.shape[0]
    if batch < 2:
        return
    leaves: list[torch.Tensor] = []
    try:
        copy = _with_leaves(output, batch, leaves)
    except Exception:  # noqa: BLE001  (a container that cannot be rebuilt: not judged)
        return
    if not leaves:
        return
    with torch.enable_grad():
        try:
            again = loss_fn(copy, targets)
        except Exception:  # noqa: BLE001  (it ran on the real output; a copy it cannot take is not judged)
            return
        if not isinstance(again, torch.Tensor) or again.shape != losses.shape or not again.requires_grad:
            return
        weights = torch.rand(batch, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.5
        weights = weights.to(again.device, again.dtype)
        plain = torch.autograd.grad(again.sum(), leaves, retain_graph=True, allow_unused=True)
        weighted = torch.autograd.grad((again * weights).sum(), leaves, allow_unused=True)
    gap = torch.zeros(batch, dtype=torch.float64)
    scale = 0.0
    for g1, g2 in zip(plain, weighted):
        if g1 is None or g2 is None:
            continue
        expected = weights.view(-1, *[1] * (g1.ndim - 1)) * g1
        gap += (g2 - expected).double().flatten(1).norm(dim=1).cpu() ** 2
        scale = max(scale, float(g2.double().norm()), float(expected.double().norm()))
    if scale == 0.0:
        return
    rows = torch.nonzero(gap.sqrt() > SEPARATION_TOLERANCE * scale).flatten().tolist()
    if rows:
        zero = float(max(g.double().norm() for g in plain if g is not None)) <= SEPARATION_TOLERANCE * scale
        raise CaptureError(
            f"loss_fn couples the examples: the losses of the batch depend on other examples' outputs (example(s) "
            f"{rows[:10]} get gradient from the others' losses"
            + ("; the summed loss does not depend on the output at all, so every q would be exactly 0" if zero else "")
            + "), e.g. through a batch mean such as l - l.mean() or a normalisation over the batch. One backward pass "
            "of the summed loss then does not give each example's own q; return each example's own loss, computed "
            "from its own output row (reduction='none', no statistics across the batch)"
        )
