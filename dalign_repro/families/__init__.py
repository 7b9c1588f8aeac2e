"""The model families of the width sweeps: one registered spec each, as a training library registers a model.

A spec answers the few questions of :class:`dalign_repro.sweep.family.Family` (data, model at a width and seed,
insertion points, batches, held-out metric, baseline, and the defaults it changes); the shared steps of
:mod:`dalign_repro.sweep` take it as an argument and call only those answers. The experiments look their family up
here, by name, and hand it to the sweep:

* :mod:`~dalign_repro.families.lm`: what the causal LMs share (their config's text fields, data, batches, loss,
  bigram baseline);
* :mod:`~dalign_repro.families.llama`: ``llama`` (the width chapter, with its sample-unit study), ``llama_depth``
  (depth 4, the growth study's models), ``llama_context`` (the context chapter);
* :mod:`~dalign_repro.families.pythia`: ``pythia``;
* :mod:`~dalign_repro.families.resnet`: ``resnet``.

May import: :mod:`dalign_repro.sweep` (the contract), :mod:`dalign_repro.training`, :mod:`dalign_repro.data`,
:mod:`dalign_repro.models`, the config and :mod:`dalign_core`; never an experiment, which reads its family from
:data:`FAMILIES`.
"""

from __future__ import annotations

import types
from typing import Mapping

from dalign_repro.families.llama import LlamaContextFamily, LlamaDepthFamily, LlamaFamily
from dalign_repro.families.pythia import PythiaFamily
from dalign_repro.families.resnet import ResNetFamily
from dalign_repro.sweep.family import Family, SweepConfig

__all__ = ["FAMILIES", "family", "register"]

_REGISTERED: dict[str, Family] = {}

FAMILIES: Mapping[str, Family] = types.MappingProxyType(_REGISTERED)
"""Family name (the prefix of its tables) → its spec; read-only (:func:`register` adds one)."""


def register(spec: Family) -> Family:
    """Add ``spec`` under its ``name``; returns it. A second spec of the same name is refused."""
    if not isinstance(spec, Family):
        raise TypeError(f"register: {spec!r} is not a Family spec")
    if spec.name in _REGISTERED and type(_REGISTERED[spec.name]) is not type(spec):
        raise ValueError(f"a family named {spec.name!r} is registered already ({type(_REGISTERED[spec.name]).__name__})")
    _REGISTERED.setdefault(spec.name, spec)
    return _REGISTERED[spec.name]


def family(name: str, config: SweepConfig | None = None) -> Family:
    """The registered spec of family ``name``; given a sweep ``config``, the spec that trains it
    (:meth:`~dalign_repro.sweep.family.Family.for_config`: ResNet's follows the config's ``augment``)."""
    try:
        spec = _REGISTERED[name]
    except KeyError:
        raise ValueError(f"no model family named {name!r}; choose one of: {', '.join(sorted(_REGISTERED))}") from None
    return spec if config is None else spec.for_config(config)


for _spec in (LlamaFamily(), LlamaDepthFamily(), LlamaContextFamily(), PythiaFamily(), ResNetFamily()):
    register(_spec)
del _spec
