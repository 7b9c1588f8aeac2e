"""The model states a capture refuses, and the error every refusal raises.

:class:`CaptureError` (a ``ValueError``) says what is wrong and what to do. :func:`check_capturable` refuses a model
whose modules, as they are now, would couple the examples or make q random (BatchNorm in training mode, active
dropout or a random drop, attention dropout in training mode); :func:`check_not_compiled` a ``torch.compile``d one,
whose graph does not run the capture's hooks. What the module state cannot show is refused by the graph
(:mod:`~dalign_core.capture.gradients`) and by the determinism self-check (:mod:`~dalign_core.capture.determinism`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["CaptureError", "check_capturable", "check_not_compiled"]


_RANDOM_PROBABILITY_ATTRS = ("p", "drop_prob", "drop_rate", "drop_path_prob", "drop_path_rate", "dropout_prob",
                             "dropout_rate")
"""Attributes that hold the probability of a random drop (a module in training mode with one in (0, 1] is random)."""
_ATTN_DROPOUT_ATTRS = ("attention_dropout", "attn_dropout", "attention_probs_dropout_prob", "dropout_p", "dropout")


class CaptureError(ValueError):
    """The model, layer or batch would give wrong activation gradients; the message says why and what to do."""


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
