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

__all__ = ["CaptureError", "ModelError", "check_capturable", "check_not_compiled", "model_error", "describe",
           "first_line", "user_frame", "check_model"]


_RANDOM_PROBABILITY_ATTRS = ("p", "drop_prob", "drop_rate", "drop_path_prob", "drop_path_rate", "dropout_prob",
                             "dropout_rate")
"""Attributes that hold the probability of a random drop (a module in training mode with one in (0, 1] is random)."""
_ATTN_DROPOUT_ATTRS = ("attention_dropout", "attn_dropout", "attention_probs_dropout_prob", "dropout_p", "dropout")


class CaptureError(ValueError):
    """The model, layer or batch would give wrong activation gradients; the message says why and what to do."""


class ModelError(CaptureError):
    """The user's model (or ``loss_fn``) raised an exception of its own on the batch it was given.

    ``model`` is the model's class name, ``where`` the dotted name of the innermost submodule that was running
    ("" for the model's own forward), ``kind`` the original exception's type name; ``__cause__`` is the original
    exception, with its traceback."""

    def __init__(self, message: str, *, model: str = "", where: str = "", kind: str = "", place: str = "",
                 detail: str = ""):
        super().__init__(message)
        self.model, self.where, self.kind = model, where, kind
        self.place = place
        """Where it raised, in words: "in its submodule 'x' (Linear)" or "in its forward"."""
        self.detail = detail
        """The first line of the original exception's message."""


def describe(value: Any) -> str:
    """A short description of a wrong argument for an error message: its type, and its elements' for a list."""
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(item).__name__ for item in value})
        return f"a {type(value).__name__} of {', '.join(kinds) or 'nothing'}"
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if value is None or isinstance(value, (int, float, str)):
        return f"{value!r} ({type(value).__name__})"
    return type(value).__name__


def check_model(model: Any) -> None:
    """Raise CaptureError unless ``model`` is a ``torch.nn.Module``."""
    if not isinstance(model, nn.Module):
        raise CaptureError(f"model must be a torch.nn.Module, got {describe(model)}")


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


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message (at most 300 characters), or its type's name."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(err).__name__


def failing_module(root: nn.Module | None, traceback: Any) -> tuple[str, nn.Module | None]:
    """``(dotted name, module)`` of the innermost ``nn.Module`` whose call was running when ``traceback`` was
    raised ("" and ``root`` when only ``root``'s own forward was; ``("", None)`` when no module call was).

    Read from the frames of ``nn.Module.__call__`` in the traceback: each holds the module it calls as ``self``.
    ``root`` None: the outermost module called is taken as the root."""
    called: list[nn.Module] = []
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code.co_name in ("_call_impl", "_wrapped_call_impl") and \
                frame.f_code.co_filename.endswith(("module.py",)):
            module = frame.f_locals.get("self")
            if isinstance(module, nn.Module) and (not called or called[-1] is not module):
                called.append(module)
        traceback = traceback.tb_next
    if not called:
        return "", None
    root = called[0] if root is None else root
    innermost = called[-1]
    if innermost is root:
        return "", root
    for name, module in root.named_modules():
        if module is innermost:
            return name, module
    return "", innermost


def user_frame(traceback: Any) -> str:
    """``file:line in function`` of the innermost frame outside torch and dalign_core ("" if none): where the
    user's own code raised, or called the torch function that did."""
    found = ""
    while traceback is not None:
        code = traceback.tb_frame.f_code
        path = code.co_filename.replace("\\", "/")
        if "/torch/" not in path and "/dalign_core/" not in path and not path.startswith("<frozen"):
            found = f"{path.rsplit('/', 1)[-1]}:{traceback.tb_lineno} in {code.co_name}"
        traceback = traceback.tb_next
    return found


def model_error(model: nn.Module, err: BaseException, given: str) -> ModelError:
    """The :class:`ModelError` for an exception ``err`` that ``model``'s forward raised on ``given`` (a short
    description of the inputs): which submodule was running, where in the user's code, and what to check."""
    name, module = failing_module(model, err.__traceback__)
    where = f"in its submodule {name!r} ({type(module).__name__})" if name else "in its forward"
    frame = user_frame(err.__traceback__)
    place = where + (f" at {frame}" if frame else "")
    return ModelError(
        f"{type(model).__name__} raised {type(err).__name__} {place} on {given}: {first_line(err)}. Check that the "
        "inputs fit the model (their keys, shapes and dtypes, and the size it was built for); the model's own "
        "traceback is this error's __cause__",
        model=type(model).__name__, where=name, kind=type(err).__name__, place=place, detail=first_line(err),
    )
