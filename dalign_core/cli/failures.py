"""One line for an exception the user's model or data raised while a ``dalign`` command ran.

A refusal the project foresaw is a :class:`~dalign_core.capture.refusals.CaptureError` or a ``LoadError`` and is
printed as it is. What the user's own model raises on the examples (any type: a ViT's ``AssertionError`` for an
image size it was not built for, a ``RuntimeError`` of shapes, an ``IndexError`` of an embedding) becomes one
line naming the model, the submodule that raised, the layer being captured and what to check; so does an
exception from a library the command called on the user's files. An exception raised in this project's own code
is a bug, and keeps its traceback. ``DALIGN_DEBUG=1`` shows every traceback.
"""

from __future__ import annotations

import argparse

__all__ = ["failure_line", "missing_package_line"]

EXTRA_OF = {"transformers": "hf", "tokenizers": "hf", "safetensors": "hf", "huggingface_hub": "hf",
            "torchvision": "vision", "datasets": "hub"}
"""The optional packages the commands import where a model or data needs them, and the extra of ``dalign`` (in
pyproject.toml) that installs each."""


def _model_name(args: argparse.Namespace) -> str:
    arch = getattr(args, "arch", None)
    return f"--arch {arch}" if arch else f"--model {getattr(args, 'model', '?')}"


def _what_to_check(args: argparse.Namespace) -> str:
    if getattr(args, "arch", None):
        return ("check that --data fits the model it builds (the input size and dtype: --image-size, --normalize, "
                "--arch-kwargs)")
    return ("check that --data and --seq-len fit the model (its positions, vocabulary and the tokenizer it was "
            "trained with)")


def _layer_text(args: argparse.Namespace) -> str:
    layer = getattr(args, "layer", None)
    return f", capturing at --layer {layer}" if layer else ""


def _deepest_frame(traceback) -> str:
    """The file of the innermost frame of a traceback (where the exception was raised)."""
    path = ""
    while traceback is not None:
        path = traceback.tb_frame.f_code.co_filename.replace("\\", "/")
        traceback = traceback.tb_next
    return path


def failure_line(err: BaseException, args: argparse.Namespace) -> str | None:
    """The one line (without the ``dalign: error:`` prefix) for ``err``, or None for a bug of this project's own
    (raised inside ``dalign_core`` with no model call on the way), which keeps its traceback."""
    from dalign_core.capture.refusals import ModelError, first_line, user_frame, failing_module

    model, layer, check = _model_name(args), _layer_text(args), _what_to_check(args)
    if isinstance(err, ModelError):  # the capture saw the model raise: it knows where and what
        kind, place, detail = err.kind, err.place, err.detail
    else:
        name, module = failing_module(None, err.__traceback__)
        frame = user_frame(err.__traceback__)
        at = f" at {frame}" if frame else ""
        kind, detail = type(err).__name__, first_line(err)
        if module is None:
            deepest = _deepest_frame(err.__traceback__)
            if "/dalign_core/" in deepest:
                return None
            library = deepest.split("site-packages/")[-1].split("/")[0] if "site-packages/" in deepest else \
                deepest.rsplit("/", 1)[-1]
            return (f"{library} raised {kind}{at} while the command read the model {model} or its --data: {detail}; "
                    f"{check} (DALIGN_DEBUG=1 shows where)")
        place = (f"in its submodule {name!r} ({type(module).__name__})" if name else
                 f"in its forward ({type(module).__name__})") + at
    return (f"the model {model} raised {kind} on the --data examples ({place}{layer}): {detail}; {check} "
            "(DALIGN_DEBUG=1 shows where)")


def missing_package_line(err: ModuleNotFoundError) -> str:
    """The one line for a package the command (or the user's model code) imported and this environment lacks: what
    is missing and how to install it, not a guess at which input failed."""
    top = (err.name or "").partition(".")[0]
    if not top:
        return f"{err} (an import failed; DALIGN_DEBUG=1 shows where)"
    extra = EXTRA_OF.get(top)
    install = (f"pip install 'dalign[{extra}]'" if extra else
               "install the package that provides it (DALIGN_DEBUG=1 shows which code imported it)")
    return f"this command needs the Python package {top!r}, which is not installed here: {install}"
