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

import difflib
import inspect
import math
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dalign_core.geometry.estimators import GeometryAccumulator

__all__ = [
    "CaptureError",
    "IGNORE_INDEX",
    "activation_gradients",
    "iter_activation_gradients",
    "accumulate_geometry",
    "insertion_points",
    "resolve_layers",
    "check_capturable",
    "check_not_compiled",
    "per_example_loss",
    "causal_lm_problem",
]

IGNORE_INDEX = -100
"""Target value ignored by the causal-LM loss (the transformers convention)."""

REDUCTIONS = ("shared", "full")
TASKS = ("auto", "causal_lm", "masked_lm", "token_classification", "classification")
_BLOCK_CLASS = re.compile(r"(DecoderLayer|EncoderLayer|Layer|Block|Bottleneck)$")
_RANDOM_PROBABILITY_ATTRS = ("p", "drop_prob", "drop_rate", "drop_path_prob", "drop_path_rate", "dropout_prob",
                             "dropout_rate")
"""Attributes that hold the probability of a random drop (a module in training mode with one in (0, 1] is random)."""
_ATTN_DROPOUT_ATTRS = ("attention_dropout", "attn_dropout", "attention_probs_dropout_prob", "dropout_p", "dropout")

LossFn = Callable[[Any, Any], torch.Tensor]


class CaptureError(ValueError):
    """The model, layer or batch would give wrong activation gradients; the message says why and what to do."""


# ---------------------------------------------------------------------------
# Layers


def _module_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules() if name]


def insertion_points(model: nn.Module) -> list[str]:
    """Dotted names of the model's residual blocks (decoder layers), in forward order.

    A block is a numbered child of a container (``….layers.3``, ``layer2.0``) whose
    class name ends in ``DecoderLayer``, ``EncoderLayer``, ``Layer``, ``Block`` or
    ``Bottleneck``; blocks nested inside another block are skipped. If none match,
    the children of the longest ``ModuleList``/``Sequential`` are returned.
    """
    names: list[str] = []
    for name, module in model.named_modules():
        if not name or not name.rsplit(".", 1)[-1].isdigit():
            continue
        if _BLOCK_CLASS.search(type(module).__name__) and not any(name.startswith(p + ".") for p in names):
            names.append(name)
    if names:
        return names
    best: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > len(best):
            best = [f"{name}.{child}" if name else child for child, _ in module.named_children()]
    if not best:
        raise CaptureError(
            f"found no residual blocks in {type(model).__name__}; name the insertion point explicitly "
            "(one of the names in model.named_modules())"
        )
    return best


def resolve_layers(model: nn.Module, layer: str | Sequence[str]) -> dict[str, nn.Module]:
    """Map each requested name (or ``"all"`` = :func:`insertion_points`) to its submodule.

    Raises:
        CaptureError: a name that is not a submodule (the message lists the nearest
            names), or a ``layer`` that is not a string or a list of strings.
    """
    _check_model(model)
    if isinstance(layer, str):
        requested = insertion_points(model) if layer == "all" else [layer]
    else:
        requested = list(layer) if isinstance(layer, Iterable) and not isinstance(layer, (Mapping, torch.Tensor)) \
            else None
        if requested is None or not all(isinstance(name, str) for name in requested):
            raise CaptureError(
                f"layer must be a submodule name such as 'model.layers.1' (a str), a list of such names, or 'all'; "
                f"got {_describe(layer)}. Names are dotted paths as printed by model.named_modules()."
            )
        if not requested:
            raise CaptureError("no layer given: name at least one submodule")
    modules = dict(model.named_modules())
    out: dict[str, nn.Module] = {}
    for name in requested:
        if name not in modules or not name:
            candidates = _module_names(model)
            near = difflib.get_close_matches(name, candidates, n=5, cutoff=0.3)
            hint = f"; nearest names: {', '.join(near)}" if near else ""
            blocks = ""
            try:
                points = insertion_points(model)
                blocks = f"; residual blocks: {points[0]} … {points[-1]} ({len(points)})"
            except CaptureError:
                pass
            raise CaptureError(
                f"{type(model).__name__} has no submodule named {name!r}{hint}{blocks}. "
                "Names are dotted paths as printed by model.named_modules()."
            )
        out[name] = modules[name]
    return out


# ---------------------------------------------------------------------------
# Refusals


def _describe(value: Any) -> str:
    """A short description of a wrong argument for an error message: its type, and its elements' for a list."""
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(item).__name__ for item in value})
        return f"a {type(value).__name__} of {', '.join(kinds) or 'nothing'}"
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if value is None or isinstance(value, (int, float, str)):
        return f"{value!r} ({type(value).__name__})"
    return type(value).__name__


def _check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise CaptureError(f"model must be a torch.nn.Module, got {_describe(model)}")


def _embedding_rows(model: nn.Module) -> int | None:
    """The number of token ids the model's input embedding accepts; None if it has no ``nn.Embedding`` input."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        return None
    return embedding.num_embeddings if isinstance(embedding, nn.Embedding) else None


def _check_token_ids(ids: Any, vocabulary: int | None, what: str) -> None:
    """Refuse token ids that are not an integer tensor, or that fall outside the model's embedding."""
    if not isinstance(ids, torch.Tensor) or ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise CaptureError(
            f"{what} must be an integer tensor of token ids (torch.long), got {_describe(ids)}; "
            "pass the tokenizer's output, or convert whole-number ids with .long()"
        )
    if vocabulary is None or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocabulary:
        bad = low if low < 0 else high
        raise CaptureError(
            f"{what} holds token id {bad}, outside the model's embedding of {vocabulary} tokens (ids 0..{vocabulary - 1}); "
            "use the tokenizer the model was trained with"
        )


def _check_batch(model: nn.Module, inputs: Any, targets: Any, loss_fn: LossFn | None) -> None:
    """Refuse inputs and targets of the wrong type before they reach the model (and fail deep inside torch)."""
    if not isinstance(inputs, (torch.Tensor, Mapping)):
        raise CaptureError(
            "inputs must be a tensor or a mapping of keyword arguments such as {'input_ids': ..., 'attention_mask': ...}, "
            f"got {_describe(inputs)}"
        )
    vocabulary = _embedding_rows(model)
    if isinstance(inputs, Mapping) and "input_ids" in inputs:
        _check_token_ids(inputs["input_ids"], vocabulary, "input_ids")
    elif isinstance(inputs, torch.Tensor) and vocabulary is not None:
        _check_token_ids(inputs, vocabulary, "inputs (token ids for a model with an input embedding)")
    if loss_fn is None and targets is not None and not isinstance(targets, torch.Tensor):
        raise CaptureError(f"targets (or a batch's labels) must be a tensor, got {_describe(targets)}")
    first = inputs.get("input_ids") if isinstance(inputs, Mapping) else inputs
    if not isinstance(first, torch.Tensor) and isinstance(inputs, Mapping):
        first = next((v for v in inputs.values() if isinstance(v, torch.Tensor)), None)
    if isinstance(first, torch.Tensor) and (first.ndim == 0 or first.shape[0] == 0):
        raise CaptureError(f"the batch holds no examples (inputs of shape {tuple(first.shape)}); pass a batch of at "
                           "least one example, its first axis the examples")
    if isinstance(inputs, Mapping):
        _check_token_batch(model, inputs)


_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length")
"""Config fields that bound a transformers model's sequence length (those ``dalign_core.cli.loading`` reads)."""


def _position_limit(model: nn.Module) -> tuple[str, int] | None:
    """(config field, value) bounding the model's sequence length; None if its config states none."""
    config = getattr(model, "config", None)
    for name in _POSITION_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def _check_token_batch(model: nn.Module, inputs: Mapping) -> None:
    """Refuse token batches the model would read wrongly or fail on deep inside: no tokens, more positions than
    the model has, an attention mask whose shape is not the ids', or one with padding between real tokens."""
    ids = inputs.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.ndim == 2:
        if ids.shape[1] == 0:
            raise CaptureError(f"input_ids of shape {tuple(ids.shape)} hold no tokens; pass at least one per example")
        limit = _position_limit(model)
        if limit is not None and ids.shape[1] > limit[1]:
            raise CaptureError(
                f"input_ids hold sequences of {ids.shape[1]} tokens, longer than the {limit[1]} positions the model "
                f"was built for (config.{limit[0]}); cut them to {limit[1]} tokens or fewer"
            )
    mask = inputs.get("attention_mask")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise CaptureError(f"attention_mask must be a tensor (batch, T) of 1 (token) and 0 (padding), got {_describe(mask)}")
    if isinstance(ids, torch.Tensor) and mask.shape != ids.shape:
        raise CaptureError(
            f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(ids.shape)}; it must have the ids' "
            "shape (batch, T), 1 at each token and 0 at each padding position (as the tokenizer returns it)"
        )
    if mask.ndim == 2 and mask.shape[1] > 1:
        real = mask != 0
        runs = real[:, 0].long() + (real[:, 1:] & ~real[:, :-1]).sum(dim=1)  # runs of real tokens per row
        broken = torch.nonzero(runs > 1).flatten().tolist()
        if broken:
            raise CaptureError(
                f"attention_mask row(s) {broken[:10]} have padding between real tokens; each example must be one run "
                "of tokens, padded on the right (or on the left)"
            )


def _left_padded(inputs: Any) -> bool:
    """True when some example of a token batch starts with padding (its attention mask starts with 0)."""
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2 or mask.shape[1] < 2:
        return False
    real = mask != 0
    return bool((~real[:, 0] & real.any(dim=1)).any())


def _positions_for_left_padding(model: nn.Module, inputs: Any, task: str, loss_fn: Any) -> Any:
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
    if not causal or "position_ids" not in _forward_params(model):
        why = "takes no position_ids" if causal else "is not captured with a causal LM's next-token loss"
        raise CaptureError(
            f"the batch is left-padded (an attention_mask row starts with 0) and {type(model).__name__} {why}, so "
            "its tokens would sit at shifted positions; pad on the right (tokenizer.padding_side = 'right'), or "
            "pass position_ids in the batch"
        )
    real = (inputs["attention_mask"] != 0).long()
    return {**inputs, "position_ids": (real.cumsum(dim=1) - 1).clamp(min=0)}


def _float_dtype(model: nn.Module) -> torch.dtype | None:
    """The floating dtype of all of the model's floating parameters; None when there are none or several."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def _as_long(value: Any) -> Any:
    """Integer (token ids, class labels) tensors other than int64 as int64, which embeddings and losses take."""
    if isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex() \
            and value.dtype not in (torch.long, torch.bool):
        return value.long()
    return value


def conform_batch(model: nn.Module, inputs: Any, targets: Any, device: torch.device | None = None) -> tuple[Any, Any]:
    """``(inputs, targets)`` on the model's device as it takes them: int32 (any integer) token ids and labels as
    int64, floating inputs in the model's floating dtype (float32 inputs for a float64 model)."""
    device = _device_of(model) if device is None else device
    if isinstance(inputs, Mapping):
        inputs = {k: _as_long(v) if k in ("input_ids", "labels") else v for k, v in inputs.items()}
    elif _embedding_rows(model) is not None:
        inputs = _as_long(inputs)
    return _to(inputs, device, _float_dtype(model)), _to(_as_long(targets), device)


def _check_sequence_first(modules: Mapping[str, nn.Module]) -> None:
    """Refuse an insertion point whose output is sequence-first (recurrent and transformer modules built with
    ``batch_first=False``): its rows are positions, not examples, and with as many positions as examples the
    axes would mix without any shape telling."""
    for name, module in modules.items():
        probe = module.layers[0] if isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)) and \
            len(module.layers) else module
        if isinstance(probe, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            probe = probe.self_attn
        if isinstance(probe, (nn.RNNBase, nn.MultiheadAttention, nn.Transformer)) and \
                not getattr(probe, "batch_first", True):
            raise CaptureError(
                f"layer {name!r} is an nn.{type(module).__name__} built with batch_first=False: its output is "
                "(sequence, batch, ...), so its first axis is not the examples and each example's gradient cannot "
                "be read from it; build it with batch_first=True (and feed it (batch, sequence, ...)), or capture "
                "a batch-first module around it"
            )


def _targets_from_labels(inputs: Any, targets: Any) -> Any:
    """A batch's ``labels`` entry, which has the transformers meaning, serves as the targets when none are given."""
    if not isinstance(inputs, Mapping) or inputs.get("labels") is None:
        return targets
    if targets is not None:
        raise CaptureError(
            "the batch has both a 'labels' entry and separate targets; pass the labels one way only "
            "(in the batch, or as targets)"
        )
    return inputs["labels"]


def _compiled(module: nn.Module) -> str:
    """How ``module`` is compiled ("" if it is not): a ``torch.compile`` wrapper or ``nn.Module.compile()``."""
    if type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), nn.Module):
        return "torch.compile"
    if getattr(module, "_compiled_call_impl", None) is not None:
        return "compile()"
    return ""


def check_not_compiled(model: nn.Module) -> None:
    """Raise :class:`CaptureError` for a ``torch.compile``d model or submodule.

    A compiled graph does not run the forward hooks that capture the layer output (or runs them on traced
    tensors), so q would be silently 0 or missing; capture on the uncompiled module (``model._orig_mod``).
    """
    for name, module in model.named_modules():
        how = _compiled(module)
        if not how:
            continue
        label = f"submodule {name!r}" if name else type(module).__name__ if how == "compile()" else "the model"
        if how == "torch.compile":
            where = "model._orig_mod" if not name else f"a model whose {name!r} is the uncompiled {name}._orig_mod"
            raise CaptureError(
                f"{label} is compiled with torch.compile (an OptimizedModule): the compiled graph does not run the "
                f"forward hooks that capture the layer output, so q would be silently 0 or missing. Capture on {where} "
                "(the same module and parameters, uncompiled), with layer names as it prints them"
            )
        raise CaptureError(
            f"{label} was compiled in place with .compile(): the compiled graph does not run the forward hooks that "
            "capture the layer output, so q would be silently 0 or missing. Capture on an uncompiled copy (built "
            "anew and loaded with the same state_dict)"
        )


def _is_probability(value: Any) -> bool:
    """A float or int in (0, 1]: a drop probability that makes a training-mode forward random."""
    return isinstance(value, (float, int)) and not isinstance(value, bool) and 0 < value <= 1


def check_capturable(model: nn.Module) -> None:
    """Raise :class:`CaptureError` if the model's current state couples examples or is random.

    Refused: a BatchNorm in training mode or without running statistics (batch
    statistics couple the examples), ``nn.Dropout``-like modules with p > 0 in
    training mode, any module in training mode holding a drop probability in (0, 1]
    (``p``, ``drop_prob``, ``drop_rate``, … : torchvision's ``StochasticDepth``, timm's
    ``DropPath``), ``nn.RReLU`` in training mode, a module in training mode with a float
    attention-dropout attribute > 0 (transformers' ``attention_dropout``), and a model in
    training mode whose ``config`` has an attention-dropout probability > 0.
    """
    check_not_compiled(model)
    problems: list[str] = []
    for name, module in model.named_modules():
        label = name or type(model).__name__
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            if module.training:
                problems.append(f"BatchNorm {label!r} is in training mode (batch statistics couple the examples)")
            elif module.running_mean is None:
                problems.append(f"BatchNorm {label!r} has no running statistics (track_running_stats=False), "
                                "so it always normalizes with batch statistics, which couple the examples")
        if not module.training:
            continue
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            problems.append(f"dropout {label!r} is active (p={module.p} in training mode)")
            continue
        if isinstance(module, nn.RReLU) and module.lower != module.upper:
            problems.append(f"RReLU {label!r} draws random slopes in training mode")
            continue
        random_attr = next((attr for attr in _RANDOM_PROBABILITY_ATTRS if _is_probability(getattr(module, attr, None))),
                           None)
        if random_attr is not None:  # torchvision's StochasticDepth and DropBlock, timm's DropPath, …
            problems.append(f"{label!r} ({type(module).__name__}) drops at random in training mode "
                            f"({random_attr}={getattr(module, random_attr)})")
            continue
        for attr in _ATTN_DROPOUT_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, (float, int)) and not isinstance(value, bool) and value > 0:
                problems.append(f"{label!r} applies attention dropout ({attr}={value} in training mode)")
                break
    config = getattr(model, "config", None)
    if model.training and config is not None:
        for key, value in sorted(vars(config).items()):
            if ("attn" in key or "attention" in key) and "drop" in key and isinstance(value, (float, int)) \
                    and not isinstance(value, bool) and value > 0:
                problems.append(f"config.{key}={value} with the model in training mode (attention dropout)")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise CaptureError(
            f"cannot capture per-example activation gradients: {shown}. Call model.eval() first "
            "(or set the dropout probabilities to 0); the capture never changes the model's mode itself."
        )


# ---------------------------------------------------------------------------
# Losses


def _logits(output: Any, logits_index: int | None = None) -> torch.Tensor:
    """The logits in a model output: the output itself (a tensor), its ``.logits``, or the one tensor of a tuple.

    A tuple or list holding several tensors (``(features, logits)``) is ambiguous: which one the logits are is
    said by ``logits_index``, never guessed (taking the first would score the features as logits)."""
    if logits_index is not None:
        if not isinstance(output, (tuple, list)) or not -len(output) <= logits_index < len(output) \
                or not isinstance(output[logits_index], torch.Tensor):
            raise CaptureError(
                f"logits_index={logits_index} does not name a tensor in the model output ({_describe(output)}); "
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
    """``"token"`` for a transformers masked-LM or token classifier, ``"causal_lm"`` for a causal-LM class, else ""."""
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


def _resolve_task(model: nn.Module | None, task: str, logits: torch.Tensor) -> str:
    """The loss ``task`` means for ``model`` and its logits: ``"auto"`` read from the model, refused when unclear.

    2-D logits: a classifier. 3-D logits: a transformers masked-LM or token classifier scores each token as it is,
    a transformers causal LM the next token; any other model must say which (``task=``): shifting the labels of a
    token classifier, or not shifting those of a causal LM, would give a silently wrong q. A next-token loss of a
    model whose attention is bidirectional is refused (:func:`causal_lm_problem`).
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
    logits = _logits(output, logits_index)
    task = _resolve_task(model, task, logits)
    if task == "classification":
        if targets is None:
            raise CaptureError("a classifier needs targets (the labels of the batch) to define each example's loss")
        logits = _at_least_float32(logits)
        if isinstance(targets, torch.Tensor) and targets.is_floating_point():  # class probabilities
            targets = targets.to(logits.dtype)
        elif isinstance(targets, torch.Tensor) and logits.ndim == 2:
            _check_label_range(targets, logits.shape[-1], "targets (class labels)", ignore=False)
        return F.cross_entropy(logits, _as_long(targets), reduction="none")
    if task in ("masked_lm", "token_classification"):
        return _token_loss(logits, inputs, targets, task)
    # causal LM
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if targets is None:
        ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else inputs
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point():
            raise CaptureError("a causal LM needs integer input_ids (or explicit targets) to define next-token losses")
        targets = ids
    elif not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        raise CaptureError(
            f"causal-LM targets (labels) must be an integer tensor of token ids, -100 where ignored; got {_describe(targets)}"
        )
    labels = _as_long(targets)
    if mask is not None:
        labels = labels.masked_fill(mask.to(labels.device) == 0, IGNORE_INDEX)
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


def _token_loss(logits: torch.Tensor, inputs: Any, targets: Any, task: str) -> torch.Tensor:
    """Mean cross-entropy of each position's own label (masked LM, token classification): ``(b, T, C)`` → ``(b,)``."""
    what = "masked-LM labels" if task == "masked_lm" else "token labels"
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        raise CaptureError(
            f"{task} needs {what}: an integer tensor (batch, T) aligned with the inputs, -100 where a position is "
            f"not scored (as transformers' labels); got {_describe(targets)}"
        )
    labels = _as_long(targets)
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


# ---------------------------------------------------------------------------
# Capture


def _device_of(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def _to(value: Any, device: torch.device, float_dtype: torch.dtype | None = None) -> Any:
    """``value`` (a tensor, or tensors nested in mappings and sequences) on ``device``; with ``float_dtype``,
    floating tensors also take that dtype (token ids and labels keep theirs)."""
    return _map_tensors(value, lambda tensor: tensor.to(device, float_dtype)
                        if float_dtype is not None and tensor.is_floating_point() else tensor.to(device))


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``fn`` applied to every tensor of ``value`` (a tensor, or tensors nested in mappings, which become dicts,
    and in tuples and lists); everything else is passed as it is."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


def _batch_rows(value: Any, batch: int, index: Any) -> Any:
    """Rows ``index`` (a slice or an index tensor) of the tensors in ``value`` whose leading dimension is the
    batch's ``batch`` examples; other tensors and values are passed as they are."""
    return _map_tensors(value, lambda tensor: tensor[index] if tensor.ndim and tensor.shape[0] == batch else tensor)


def _check_options(reduction: Any, task: Any, loss_fn: Any, logits_index: Any = None) -> None:
    if reduction not in REDUCTIONS:
        raise CaptureError(f"reduction must be one of {REDUCTIONS}, got {_describe(reduction)}")
    if task not in TASKS:
        raise CaptureError(f"task must be one of {TASKS}, got {_describe(task)}")
    if loss_fn is not None and not callable(loss_fn):
        raise CaptureError(f"loss_fn must be a function (output, targets) -> per-example losses, got {_describe(loss_fn)}")
    if logits_index is not None and (not isinstance(logits_index, numbers.Integral) or isinstance(logits_index, bool)):
        raise CaptureError(f"logits_index must be an int (the position of the logits in the model's output tuple) or "
                           f"None, got {_describe(logits_index)}")


def _check_flag(check_determinism: Any) -> None:
    if not isinstance(check_determinism, bool):
        raise CaptureError(f"check_determinism must be True or False, got {_describe(check_determinism)}")


def _check_batches(batches: Any) -> None:
    """``batches`` is an iterable of batches; a single batch (a tensor or a mapping) is refused, not iterated."""
    if isinstance(batches, (torch.Tensor, Mapping)) or not isinstance(batches, Iterable):
        raise CaptureError(
            f"batches must be an iterable of batches (a list, a DataLoader, a generator), got {_describe(batches)}; "
            "wrap a single batch in a list: [batch]"
        )


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    return batch, None


def _call(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        kwargs = {k: v for k, v in inputs.items() if k != "labels"}
        if hasattr(getattr(model, "config", None), "use_cache") or "use_cache" in _forward_params(model):
            kwargs.setdefault("use_cache", False)  # no key/value cache: it only costs memory here
        return model(**kwargs)
    return model(inputs)


def _forward_params(model: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _primary(output: Any) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """The hidden-state tensor of a module output and a function that rebuilds the output around a replacement."""
    if isinstance(output, torch.Tensor):
        return output, lambda t: t
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0], lambda t: type(output)((t, *output[1:])) if isinstance(output, tuple) else [t, *output[1:]]
    raise CaptureError(
        f"the layer returned {type(output).__name__}, not a tensor or a tuple starting with one; "
        "capture a submodule whose output is the hidden state"
    )


def _reduce(grad: torch.Tensor, reduction: str) -> torch.Tensor:
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


def _take_first(value: Any, batch: int) -> Any:
    """A batch of the same size made of example 0 repeated: tensors with a leading dimension of ``batch`` (also in
    mappings and sequences) repeat their first row; everything else is passed as it is.

    The same batch size keeps the kernels' arithmetic (a batch of one can take other code paths, whose rounding
    flips a ReLU at an exact zero and moves q by percents); the other examples change, so batch statistics do."""
    return _batch_rows(value, batch, [0] * batch)


def _in_place_error(names: Sequence[str]) -> CaptureError:
    which = ", ".join(repr(name) for name in names)
    return CaptureError(
        f"an in-place operation modified the output of {which} after it was produced (e.g. relu(..., inplace=True) or "
        "+= on it), so the gradient with respect to it would be taken at the modified tensor and q would be wrong; "
        "capture at another layer (e.g. the block containing that operation) or replace the in-place operation"
    )


def _gradients(model, modules: dict[str, nn.Module], inputs, targets, task, loss_fn,
               logits_index: int | None = None) -> dict[str, torch.Tensor]:
    """One forward pass and one backward pass down to the layers' outputs z: ∂(Σ_i ℓ_i)/∂z per layer (z's shape).

    Refuses what :func:`_forward_to_losses` refuses, and a layer whose output no gradient path links to the loss.
    """
    zs, losses = _forward_to_losses(model, modules, inputs, targets, task, loss_fn, logits_index)
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


def _forward_to_losses(model, modules: dict[str, nn.Module], inputs, targets, task, loss_fn,
                       logits_index: int | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One forward pass with gradients on: each layer's output z (in the order of ``modules``) and the per-example
    losses (batch,), ready for backward passes down to the zs.

    Refuses what the graph shows would give a wrong gradient: a layer that does not run exactly once, an output that
    is not batch-first, an in-place change of z after the hook saw it (z's version counter moved), non-finite
    losses, and a loss that no gradient path links to any z.
    """
    captured: dict[str, list[tuple[torch.Tensor, int]]] = {name: [] for name in modules}

    def make_hook(name: str):
        def hook(module, args, output):
            tensor, rebuild = _primary(output)
            replacement = None
            if not tensor.requires_grad:  # e.g. frozen parameters upstream: make z a leaf we can differentiate
                tensor = tensor.detach().requires_grad_(True)
                replacement = rebuild(tensor)
            captured[name].append((tensor, tensor._version))
            return replacement
        return hook

    handles = []
    try:
        for name, module in modules.items():
            handles.append(module.register_forward_hook(make_hook(name)))
        inputs = _positions_for_left_padding(model, inputs, task, loss_fn)
        with torch.enable_grad():
            try:
                output = _call(model, inputs)
            except RuntimeError as err:  # an in-place op on the leaf the hook made for a frozen upstream
                if "leaf Variable that requires grad" in str(err) and "in-place" in str(err):
                    raise _in_place_error([n for n, seen in captured.items() if seen and seen[-1][0].is_leaf]) from err
                raise
            for handle in handles:  # no hook may outlive the forward pass
                handle.remove()
            handles = []
            for name, seen in captured.items():
                if len(seen) != 1:
                    what = "did not run" if not seen else f"ran {len(seen)} times"
                    raise CaptureError(
                        f"layer {name!r} {what} in one forward pass; an insertion point must be a submodule that runs "
                        "exactly once per forward"
                    )
            if loss_fn is not None:
                losses = loss_fn(output, targets)
            else:  # the task read from the model here, where the model is known
                logits = _logits(output, logits_index)
                losses = per_example_loss(logits, inputs, targets, _resolve_task(model, task, logits))
            if losses.ndim != 1:
                raise CaptureError(f"per-example losses must have shape (batch,), got {tuple(losses.shape)}")
            bad = torch.nonzero(~torch.isfinite(losses.detach())).flatten().tolist()
            if bad:
                raise CaptureError(
                    f"non-finite loss for example(s) {bad[:10]} of {losses.shape[0]} "
                    f"(values {[float(losses.detach()[i]) for i in bad[:3]]}); check the inputs, targets and the model's dtype"
                )
            zs = [captured[name][0][0] for name in modules]
            for name, z in zip(modules, zs):
                if z.shape[0] != losses.shape[0]:
                    raise CaptureError(
                        f"layer {name!r} output has leading dimension {z.shape[0]}, the batch has {losses.shape[0]} "
                        "examples; the insertion point's output must be batch-first"
                    )
            modified = [name for name in modules if captured[name][0][0]._version != captured[name][0][1]]
            if modified:
                raise _in_place_error(modified)
            if not losses.requires_grad:
                raise CaptureError(
                    f"the loss does not depend on the output of {list(modules)} through autograd (was the forward, or "
                    "the part after the layer, run under torch.no_grad() or on detached tensors?); q would be 0"
                )
    finally:
        for handle in handles:
            handle.remove()
    return zs, losses


def _determinism_tolerance(dtype: torch.dtype) -> float:
    """Relative difference of a recomputed gradient above which it is not rounding: 1e-5, or 8 ulps for half precision."""
    return max(1e-5, 8 * torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-5


def _random_states() -> list[torch.Tensor]:
    """The states of torch's default random number generators: the CPU one and each initialized CUDA device's."""
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def _drew_random_numbers(before: list[torch.Tensor]) -> bool:
    """Whether a default generator moved since ``before`` (:func:`_random_states`): something drew random numbers.

    Every random operation in torch (dropout, ``bernoulli_``, ``rand*``) advances its device's generator, whatever
    module or function calls it: the dependable sign that the forward is random, where the module flags miss a
    functional call with ``training=True`` and a recomputation of one example sees a random drop only when it
    happens to differ (stochastic depth of p = 0.1 keeps both copies of an example 81% of the time)."""
    return any(not torch.equal(a, b) for a, b in zip(_random_states(), before))  # a device set up since: not compared


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
        again = _gradients(model, modules, _batch_rows(inputs, batch, first), _batch_rows(targets, batch, first), task,
                           loss_fn, logits_index)
    except Exception:  # noqa: BLE001  (the decisive check runs it at full size and says what failed)
        return False
    return all(again[name].shape[1:] == grad.shape[1:] and
               _relative_gap(grad[:1], again[name]) <= _determinism_tolerance(grad.dtype)
               for name, grad in grads.items())


def _check_deterministic(model, modules, inputs, targets, task, loss_fn, grads: dict[str, torch.Tensor],
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
    state (:func:`_drew_random_numbers`).
    """
    batch = next(iter(grads.values())).shape[0]
    if batch > 1 and _agrees_alone(model, modules, inputs, targets, task, loss_fn, grads, logits_index, batch):
        return
    try:
        again = _gradients(model, modules, _take_first(inputs, batch), _take_first(targets, batch), task, loss_fn,
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


def _capture(model, modules: dict[str, nn.Module], inputs, targets, reductions: tuple[str, ...], task, loss_fn,
             check_determinism: bool = False, logits_index: int | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """One forward and one backward pass; reduction → layer name → (batch, d) rows, every reduction from one gradient.

    The public callers have checked the reductions, task and loss (:func:`_check_options`)."""
    check_capturable(model)
    _check_sequence_first(modules)
    targets = _targets_from_labels(inputs, targets)
    _check_batch(model, inputs, targets, loss_fn)
    inputs, targets = conform_batch(model, inputs, targets)
    before = _random_states() if check_determinism else None
    grads = _gradients(model, modules, inputs, targets, task, loss_fn, logits_index)
    if before is not None and _drew_random_numbers(before):
        raise CaptureError(
            "the model is not deterministic in eval mode: dropout or batch statistics in training mode? Its forward "
            "drew random numbers (torch's random number generator moved during the capture), so q is random: look "
            "for F.dropout(..., training=True), a random drop (stochastic depth) or torch.rand*/bernoulli in the "
            "forward; nn.Dropout modules in eval mode are fine"
        )
    out: dict[str, dict[str, torch.Tensor]] = {reduction: {} for reduction in reductions}
    for name, grad in grads.items():
        for reduction in reductions:
            rows = _reduce(grad, reduction)
            bad_rows = torch.nonzero(~torch.isfinite(rows).all(dim=1)).flatten().tolist()
            if bad_rows:
                raise CaptureError(f"non-finite activation gradient at {name!r} for example(s) {bad_rows[:10]}")
            out[reduction][name] = rows
    if check_determinism:
        _check_deterministic(model, modules, inputs, targets, task, loss_fn, grads, logits_index)
    return out


def _captures(model, modules: dict[str, nn.Module], batches: Iterable[Any], reductions: tuple[str, ...], task, loss_fn,
              check_determinism: bool, logits_index: int | None = None) -> Iterator[dict[str, dict[str, torch.Tensor]]]:
    """:func:`_capture` of each batch in turn (``check_determinism`` on the first batch only)."""
    for index, batch in enumerate(batches):
        inputs, targets = _split_batch(batch)
        yield _capture(model, modules, inputs, targets, reductions, task, loss_fn, check_determinism and index == 0,
                       logits_index)


def _reductions(reduction: Any) -> tuple[str, ...]:
    """``"shared"`` → ``("shared",)``; a list or tuple of reductions → a tuple of distinct ones, each checked."""
    if isinstance(reduction, str) or not isinstance(reduction, (list, tuple)):
        return (reduction,)
    if not reduction or len(set(reduction)) != len(reduction):
        raise CaptureError(f"reduction must be one of {REDUCTIONS} or a list of distinct ones, got {_describe(reduction)}")
    return tuple(reduction)


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
    _check_model(model)
    check_not_compiled(model)  # before the names: a compiled model's are prefixed with "_orig_mod."
    modules = resolve_layers(model, layer)
    _check_options(reduction, task, loss_fn, logits_index)
    _check_flag(check_determinism)
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
    _check_model(model)
    check_not_compiled(model)
    modules = resolve_layers(model, layer)  # fail before the first batch
    _check_options(reduction, task, loss_fn, logits_index)
    _check_flag(check_determinism)
    _check_batches(batches)
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
    _check_model(model)
    check_not_compiled(model)
    modules = resolve_layers(model, layer)
    reductions = _reductions(reduction)
    for each in reductions:
        _check_options(each, task, loss_fn, logits_index)
    _check_flag(check_determinism)
    _check_batches(batches)
    single = isinstance(layer, str) and layer != "all"
    if examples is not None and not _is_positive_int(examples):
        raise CaptureError(f"examples must be a positive int (a number of examples) or None, got {_describe(examples)}")
    if sketch_dim is not None and not _is_positive_int(sketch_dim):
        raise CaptureError(f"sketch_dim must be a positive int or None, got {_describe(sketch_dim)}")
    accumulators = {
        each: {name: GeometryAccumulator(sketch_dim=sketch_dim, seed=seed, device=device) for name in modules}
        for each in reductions
    }
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=examples, desc=desc, unit="ex", leave=False)
    seen = 0
    try:
        for captured in _captures(model, modules, batches, reductions, task, loss_fn, check_determinism,
                                  logits_index):
            batch_size = len(next(iter(captured[reductions[0]].values())))
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
    shaped = {each: by_layer[next(iter(modules))] if single else by_layer for each, by_layer in accumulators.items()}
    return shaped[reduction] if isinstance(reduction, str) else shaped
