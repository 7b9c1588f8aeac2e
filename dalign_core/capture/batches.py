"""What a batch is and how it reaches the model: its refusals (token ids, position limit, attention mask), the
model's device and dtype, example rows, and the model called on it.

A batch for the iterator forms is a ``Mapping`` (e.g. a tokenizer's ``BatchEncoding``), a tensor of inputs, or a
pair ``(inputs, targets)`` (:func:`split_batch`).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dalign_core.capture.refusals import CaptureError, _describe

if TYPE_CHECKING:
    from dalign_core.capture.losses import LossFn

__all__ = ["conform_batch", "position_limit", "split_batch", "call_model", "to_device", "targets_from_labels"]


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
    if (loss_fn is None and isinstance(first, torch.Tensor) and isinstance(targets, torch.Tensor)
            and targets.ndim >= 1 and targets.shape[0] != first.shape[0]):
        raise CaptureError(f"targets hold {targets.shape[0]} example(s) but the inputs {first.shape[0]}; give one "
                           "target per example (the first axis of both is the examples)")
    if isinstance(inputs, Mapping):
        _check_token_batch(model, inputs)


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
    if isinstance(ids, torch.Tensor) and ids.ndim == 2:
        if ids.shape[1] == 0:
            raise CaptureError(f"input_ids of shape {tuple(ids.shape)} hold no tokens; pass at least one per example")
        limit = position_limit(model)
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
    return to_device(inputs, device, _float_dtype(model)), to_device(_as_long(targets), device)


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


def _device_of(model: nn.Module) -> torch.device:
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


def _batch_rows(value: Any, batch: int, index: Any) -> Any:
    """Rows ``index`` (a slice or an index tensor) of the tensors in ``value`` whose leading dimension is the
    batch's ``batch`` examples; other tensors and values are passed as they are."""
    return _map_tensors(value, lambda tensor: tensor[index] if tensor.ndim and tensor.shape[0] == batch else tensor)


def _take_first(value: Any, batch: int) -> Any:
    """A batch of the same size made of example 0 repeated: tensors with a leading dimension of ``batch`` (also in
    mappings and sequences) repeat their first row; everything else is passed as it is.

    The same batch size keeps the kernels' arithmetic (a batch of one can take other code paths, whose rounding
    flips a ReLU at an exact zero and moves q by percents); the other examples change, so batch statistics do."""
    return _batch_rows(value, batch, [0] * batch)


def _check_batches(batches: Any) -> None:
    """``batches`` is an iterable of batches; a single batch (a tensor or a mapping) is refused, not iterated."""
    if isinstance(batches, (torch.Tensor, Mapping)) or not isinstance(batches, Iterable):
        raise CaptureError(
            f"batches must be an iterable of batches (a list, a DataLoader, a generator), got {_describe(batches)}; "
            "wrap a single batch in a list: [batch]"
        )


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    return batch, None


def call_model(model: nn.Module, inputs: Any) -> Any:
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
