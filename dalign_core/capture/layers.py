"""Which layers are captured: a model's residual blocks (its insertion points), and names resolved to submodules."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from dalign_core.capture.refusals import CaptureError, check_model, describe

__all__ = ["insertion_points", "resolve_layers", "check_sequence_first"]


_BLOCK_CLASS = re.compile(r"(DecoderLayer|EncoderLayer|Layer|Block|Bottleneck)$")
_NUMBERED = re.compile(r"(^|_)\d+$")
"""A numbered child: ``3`` in a ModuleList, or ``encoder_layer_3`` in a named Sequential (torchvision's ViT)."""


def _module_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules() if name]


def insertion_points(model: nn.Module) -> list[str]:
    """Dotted names of the model's residual blocks (decoder layers), in forward order.

    A block is a numbered child of a container (``….layers.3``, ``layer2.0``, ``encoder_layer_3``) whose
    class name ends in ``DecoderLayer``, ``EncoderLayer``, ``Layer``, ``Block`` or
    ``Bottleneck``; blocks nested inside another block are skipped. If none match,
    the composite children of every ``ModuleList`` (blocks kept in lists, in forward
    order, also lists inside a ``ModuleDict``); failing that, the children of the
    longest ``ModuleList``/``Sequential``.
    """
    names: list[str] = []
    for name, module in model.named_modules():
        if not name or not _NUMBERED.search(name.rsplit(".", 1)[-1]):
            continue
        if _BLOCK_CLASS.search(type(module).__name__) and not any(name.startswith(p + ".") for p in names):
            names.append(name)
    if names:
        return names
    for name, module in model.named_modules():  # blocks held in lists: every list of composite modules, in order
        if isinstance(module, nn.ModuleList) and not any(name.startswith(p + ".") for p in names):
            children = [f"{name}.{child}" if name else child for child, sub in module.named_children()
                        if any(True for _ in sub.children())]
            names += children
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
    check_model(model)
    if isinstance(layer, str):
        requested = insertion_points(model) if layer == "all" else [layer]
    else:
        requested = list(layer) if isinstance(layer, Iterable) and not isinstance(layer, (Mapping, torch.Tensor)) \
            else None
        if requested is None or not all(isinstance(name, str) for name in requested):
            raise CaptureError(
                f"layer must be a submodule name such as 'model.layers.1' (a str), a list of such names, or 'all'; "
                f"got {describe(layer)}. Names are dotted paths as printed by model.named_modules()."
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


def check_sequence_first(modules: Mapping[str, nn.Module]) -> None:
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
