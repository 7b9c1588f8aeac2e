"""What a batch is and how it reaches the model: its refusals (token ids, position limit, attention mask), the
model's device and dtype, example rows, and the model called on it.

A batch for the iterator forms is a ``Mapping`` (e.g. a tokenizer's ``BatchEncoding``), a tensor of inputs, or a
pair ``(inputs, targets)`` (:func:`split_batch`).
"""

from __future__ import annotations

import difflib
import inspect
import numbers
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from dalign_core.capture.refusals import CaptureError, describe, model_error

__all__ = ["conform_batch", "position_limit", "split_batch", "call_model", "to_device", "targets_from_labels",
           "batch_rows", "take_first", "check_batch", "check_batches", "is_positive_int", "as_long",
           "forward_params", "device_of"]


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
            f"{what} must be an integer tensor of token ids (torch.long), got {describe(ids)}; "
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


def check_batch(model: nn.Module, inputs: Any, targets: Any, loss_fn: Callable[[Any, Any], torch.Tensor] | None) -> None:
    """Refuse inputs and targets of the wrong type before they reach the model (and fail deep inside torch), and
    a call the capture cannot differentiate (inside ``torch.inference_mode()``, a model on the meta device)."""
    _check_grad_mode(model)
    if not isinstance(inputs, (torch.Tensor, Mapping)):
        raise CaptureError(
            "inputs must be a tensor or a mapping of keyword arguments such as {'input_ids': ..., 'attention_mask': ...}, "
            f"got {describe(inputs)}"
        )
    vocabulary = _embedding_rows(model)
    if isinstance(inputs, Mapping) and "input_ids" in inputs:
        _check_token_ids(inputs["input_ids"], vocabulary, "input_ids")
    elif isinstance(inputs, torch.Tensor) and vocabulary is not None:
        _check_token_ids(inputs, vocabulary, "inputs (token ids for a model with an input embedding)")
    if loss_fn is None and targets is not None and not isinstance(targets, torch.Tensor):
        raise CaptureError(f"targets (or a batch's labels) must be a tensor, got {describe(targets)}")
    first = inputs.get("input_ids") if isinstance(inputs, Mapping) else inputs
    if not isinstance(first, torch.Tensor) and isinstance(inputs, Mapping):
        first = next((v for v in inputs.values() if isinstance(v, torch.Tensor)), None)
    if isinstance(first, torch.Tensor) and (first.ndim == 0 or first.shape[0] == 0):
        raise CaptureError(f"the batch holds no examples (inputs of shape {tuple(first.shape)}); pass a batch of at "
                           "least one example, its first axis the examples")
    if (loss_fn is None and isinstance(first, torch.Tensor) and isinstance(targets, torch.Tensor)
            and targets.ndim >= 1 and targets.shape[0] != first.shape[0]):
        raise CaptureError(f"targets hold {targets.shape[0]} example(s) but the inputs {first.shape[0]}; give one "
                           "target per example (the first axis of both is the examples)")
    if isinstance(inputs, Mapping):
        _check_batch_keys(model, inputs)
        _check_token_batch(model, inputs)


def _check_grad_mode(model: nn.Module) -> None:
    """Refuse a capture inside ``torch.inference_mode()`` and a model whose weights are not there to differentiate
    (on the meta device, or made inside inference mode). ``torch.no_grad()`` is fine: the capture enables
    gradients for its own passes."""
    if torch.is_inference_mode_enabled():
        raise CaptureError(
            "the capture was called inside torch.inference_mode(), where no gradient can be formed (enabling "
            "gradients does not undo it); call it outside the inference_mode block (torch.no_grad() is fine)"
        )
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise CaptureError(
                f"the model's {name!r} is on the meta device (a shape without values: the weights were never "
                "loaded), so no forward can run; load the weights (e.g. from_pretrained, or "
                "model.to_empty(device=...) then load_state_dict) before capturing"
            )
        if tensor.is_inference():
            raise CaptureError(
                f"the model's {name!r} was created inside torch.inference_mode(), so autograd cannot use it; build "
                "or load the model outside inference mode (or replace it with a clone made outside it)"
            )


_COMMON_KEYS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds", "pixel_values",
                "labels", "decoder_input_ids", "decoder_attention_mask", "head_mask", "past_key_values",
                "cache_position", "pixel_mask", "input_values", "input_features")
"""Batch keys of transformers models, against which a misspelt key is recognised."""


def _forward_owner(model: nn.Module) -> nn.Module:
    """The module whose forward reads the batch's keys: a ``DataParallel``/``DistributedDataParallel`` wrapper's
    ``module``, else the model."""
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return model


def _keyword_names(model: nn.Module) -> tuple[set[str], str]:
    """The keyword arguments ``model``'s forward names, and how it takes others: "none" (they raise), "closed"
    (``**kwargs`` typed as ``Unpack[TypedDict]``, whose keys are added; every transformers model's extra keys are
    its ``TransformersKwargs``), "open" (an untyped ``**kwargs``, which may swallow any key) or "unknown" (no
    signature to read)."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return set(), "unknown"
    names = {n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    extra = next((p for p in parameters.values() if p.kind == p.VAR_KEYWORD), None)
    if extra is None:
        return names, "none"
    typed = typing.get_args(extra.annotation) if typing.get_origin(extra.annotation) is typing.Unpack else ()
    if type(model).__module__.startswith("transformers."):  # its decorators read these before the forward does
        names = names | {"return_dict", "output_attentions", "output_hidden_states"}
    if typed and isinstance(getattr(typed[0], "__annotations__", None), dict):
        return names | set(typed[0].__annotations__), "closed"
    if type(model).__module__.startswith("transformers."):
        try:
            from transformers.utils.generic import TransformersKwargs
        except ImportError:  # pragma: no cover - an older transformers: its extra keys are not known
            return names, "open"
        return names | set(TransformersKwargs.__annotations__), "closed"
    return names, "open"


def _check_batch_keys(model: nn.Module, inputs: Mapping) -> None:
    """Refuse a batch key the model's forward does not take (a misspelt ``atention_mask`` would be swallowed by a
    ``**kwargs`` and the padding scored as tokens); warn about one that only an untyped ``**kwargs`` takes."""
    bad = [key for key in inputs if not isinstance(key, str)]
    if bad:
        raise CaptureError(f"the batch's keys must be strings (the forward's keyword arguments), got {bad[:3]!r}")
    owner = _forward_owner(model)
    names, extra = _keyword_names(owner)
    if extra == "unknown" or (extra == "open" and not names):  # a pass-through forward(*args, **kwargs)
        return
    keys = [key for key in inputs if key != "labels" and key not in names]
    where = f"{type(owner).__name__}.forward"
    for key in keys:
        near = difflib.get_close_matches(key, sorted(names | set(_COMMON_KEYS)), n=1, cutoff=0.75)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        if extra != "open" or near:
            takes = ", ".join(sorted(n for n in names if n not in ("self", "kwargs"))[:12])
            raise CaptureError(
                f"the batch's key {key!r} is not an argument of {where}" +
                (" (its **kwargs would swallow it unread)" if extra != "none" else "") +
                f"{hint} It takes: {takes}. Rename or drop the key: a key the model does not read (a misspelt "
                "attention_mask) would change q without a word"
            )
        warnings.warn(
            f"the batch's key {key!r} is not a named argument of {where}: it goes to its **kwargs, which may not "
            "read it; if q should depend on it, pass it under the name the forward reads", UserWarning, stacklevel=4,
        )


_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length")
"""Config fields that bound a transformers model's sequence length (those ``dalign_core.cli.loading`` reads)."""


def position_limit(model: nn.Module) -> tuple[str, int] | None:
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
    if isinstance(ids, torch.Tensor) and ids.ndim != 2:
        fix = "add the batch axis: input_ids[None] (or .unsqueeze(0))" if ids.ndim == 1 else \
            "flatten the extra axes into the examples' axis"
        raise CaptureError(f"input_ids must be a 2-D tensor (batch, T) of token ids, got shape {tuple(ids.shape)}; "
                           + fix)
    if isinstance(ids, torch.Tensor) and ids.ndim == 2:
        if ids.shape[1] == 0:
            raise CaptureError(f"input_ids of shape {tuple(ids.shape)} hold no tokens; pass at least one per example")
        limit = position_limit(model)
        if limit is not None and ids.shape[1] > limit[1]:
            raise CaptureError(
                f"input_ids hold sequences of {ids.shape[1]} tokens, longer than the {limit[1]} positions the model "
                f"was built for (config.{limit[0]}); cut them to {limit[1]} tokens or fewer"
            )
    _check_position_ids(model, inputs.get("position_ids"), ids)
    mask = inputs.get("attention_mask")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise CaptureError(f"attention_mask must be a tensor (batch, T) of 1 (token) and 0 (padding), got {describe(mask)}")
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


def _check_position_ids(model: nn.Module, positions: Any, ids: Any) -> None:
    """Refuse ``position_ids`` that are not integers, of another shape than the ids, or outside the positions the
    model has (its embedding would fail on them deep inside torch)."""
    if positions is None:
        return
    if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.dtype == torch.bool:
        raise CaptureError(f"position_ids must be an integer tensor (batch, T), got {describe(positions)}")
    if isinstance(ids, torch.Tensor) and positions.shape != ids.shape and positions.shape != ids.shape[1:] and \
            positions.shape != (1, *ids.shape[1:]):
        raise CaptureError(f"position_ids have shape {tuple(positions.shape)}, input_ids {tuple(ids.shape)}; give "
                           "one position per token (the ids' shape)")
    limit = position_limit(model)
    if positions.numel() and (int(positions.min()) < 0 or (limit is not None and int(positions.max()) >= limit[1])):
        bad = int(positions.min()) if int(positions.min()) < 0 else int(positions.max())
        top = f"0..{limit[1] - 1} (config.{limit[0]})" if limit else "0 or more"
        raise CaptureError(f"position_ids hold {bad}, outside the model's positions {top}; number each example's "
                           "tokens from 0")


def _float_dtype(model: nn.Module) -> torch.dtype | None:
    """The floating dtype of all of the model's floating parameters; None when there are none or several."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def as_long(value: Any) -> Any:
    """Integer (token ids, class labels) tensors other than int64 as int64, which embeddings and losses take."""
    if isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex() \
            and value.dtype not in (torch.long, torch.bool):
        return value.long()
    return value


def conform_batch(model: nn.Module, inputs: Any, targets: Any, device: torch.device | None = None) -> tuple[Any, Any]:
    """``(inputs, targets)`` on the model's device as it takes them: int32 (any integer) token ids and labels as
    int64, floating inputs in the model's floating dtype (float32 inputs for a float64 model), and tensors made
    inside ``torch.inference_mode()`` as ordinary clones."""
    device = device_of(model) if device is None else device
    # a tensor made inside torch.inference_mode() cannot enter autograd; its clone (made here, outside) can
    inputs, targets = (_map_tensors(v, lambda t: t.clone() if t.is_inference() else t) for v in (inputs, targets))
    if isinstance(inputs, Mapping):
        inputs = {k: as_long(v) if k in ("input_ids", "labels") else v for k, v in inputs.items()}
    elif _embedding_rows(model) is not None:
        inputs = as_long(inputs)
    return to_device(inputs, device, _float_dtype(model)), to_device(as_long(targets), device)


def targets_from_labels(inputs: Any, targets: Any) -> Any:
    """A batch's ``labels`` entry, which has the transformers meaning, serves as the targets when none are given."""
    if not isinstance(inputs, Mapping) or inputs.get("labels") is None:
        return targets
    if targets is not None:
        raise CaptureError(
            "the batch has both a 'labels' entry and separate targets; pass the labels one way only "
            "(in the batch, or as targets)"
        )
    return inputs["labels"]


def device_of(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (else first buffer, else the CPU): where its inputs go."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def to_device(value: Any, device: torch.device, float_dtype: torch.dtype | None = None) -> Any:
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


def batch_rows(value: Any, batch: int, index: Any) -> Any:
    """Rows ``index`` (a slice or an index tensor) of the tensors in ``value`` whose leading dimension is the
    batch's ``batch`` examples; other tensors and values are passed as they are."""
    return _map_tensors(value, lambda tensor: tensor[index] if tensor.ndim and tensor.shape[0] == batch else tensor)


def take_first(value: Any, batch: int) -> Any:
    """A batch of the same size made of example 0 repeated: tensors with a leading dimension of ``batch`` (also in
    mappings and sequences) repeat their first row; everything else is passed as it is.

    The same batch size keeps the kernels' arithmetic (a batch of one can take other code paths, whose rounding
    flips a ReLU at an exact zero and moves q by percents); the other examples change, so batch statistics do."""
    return batch_rows(value, batch, [0] * batch)


def check_batches(batches: Any) -> None:
    """``batches`` is an iterable of batches; a single batch (a tensor or a mapping) is refused, not iterated."""
    if isinstance(batches, (torch.Tensor, Mapping)) or not isinstance(batches, Iterable):
        raise CaptureError(
            f"batches must be an iterable of batches (a list, a DataLoader, a generator), got {describe(batches)}; "
            "wrap a single batch in a list: [batch]"
        )


def is_positive_int(value: Any) -> bool:
    """True for an integer (not a bool) of at least 1."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    return batch, None


def _describe_inputs(inputs: Any) -> str:
    """The inputs as an error message names them: each tensor's key, shape and dtype."""
    if isinstance(inputs, Mapping):
        parts = [f"{k} {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}" if isinstance(v, torch.Tensor)
                 else f"{k} {type(v).__name__}" for k, v in inputs.items()]
        return "inputs {" + ", ".join(parts[:6]) + "}"
    if isinstance(inputs, torch.Tensor):
        return f"inputs of shape {tuple(inputs.shape)} ({str(inputs.dtype).replace('torch.', '')})"
    return f"inputs {describe(inputs)}"


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model`` called on ``inputs`` (a mapping as keyword arguments, without ``labels``; anything else as the
    one argument). An exception of the model's own becomes a :class:`~dalign_core.capture.refusals.ModelError`
    that names the submodule that raised and the inputs it was given (the original is its ``__cause__``)."""
    try:
        if isinstance(inputs, Mapping):
            kwargs = {k: v for k, v in inputs.items() if k != "labels"}
            if hasattr(getattr(model, "config", None), "use_cache") or "use_cache" in forward_params(model):
                kwargs.setdefault("use_cache", False)  # no key/value cache: it only costs memory here
            return model(**kwargs)
        return model(inputs)
    except CaptureError:  # a refusal from the capture's own hook
        raise
    except RuntimeError as err:  # an in-place op on a leaf the hook made: the capture says what it means
        if "leaf Variable that requires grad" in str(err):
            raise
        raise model_error(model, err, _describe_inputs(inputs)) from err
    except Exception as err:  # noqa: BLE001  (the user's model: any type it raises is its own)
        raise model_error(model, err, _describe_inputs(inputs)) from err


def forward_params(model: nn.Module) -> set[str]:
    """The names of the parameters of ``model.forward`` (empty where its signature cannot be read)."""
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()
