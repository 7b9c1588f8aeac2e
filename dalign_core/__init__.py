"""dalign_core: measure the effective alignment dimension d_align of a model's activation gradients.

The small library an engineer installs alone (torch, numpy and tqdm), in rooms bottom first:

* :mod:`dalign_core.geometry` — no model, no file: the exact moments and bounds (d_∥, d_2, d_align, B_exact,
  B_align), the unbiased Gram U-statistics, the streamed accumulator, misalignment resampling.
* :mod:`dalign_core.capture` — q = dℓ/dz at an insertion point for every example from one backward pass of the
  summed loss, with the refusals that keep it exact and a self-check.
* :mod:`dalign_core.growth` — what a growth method reads at each insertion point before it grows there.
* :mod:`dalign_core.cli` — the ``dalign`` command (``estimate``, ``layers``, ``rank``) and its model loading.

:mod:`dalign_core.atomic` writes files by temporary name and rename; :mod:`dalign_core.device` resolves where a
process computes; :mod:`dalign_core.environment` reads on/off flags; :mod:`dalign_core.seeding` derives seeds from
names. The reproduction of the paper (:mod:`dalign_repro`) is built on this package and never
imported by it.
"""

from __future__ import annotations

import importlib
from typing import Any

# The names below load their module (and torch) on first use, so `import dalign_core` is instant and the
# `dalign` command can catch Ctrl-C while torch loads (PEP 562).
_LAZY = {
    **dict.fromkeys(("EffectiveDims", "alignment_mean", "alignment_variance", "b_align", "b_exact",
                     "effective_dims", "n_eff"), "geometry.bounds"),
    **dict.fromkeys(("estimate_geometry", "plugin_geometry"), "geometry.estimators"),
    "Geometry": "geometry.ustatistics", "GeometryAccumulator": "geometry.accumulator",
    **dict.fromkeys(("activation_gradients", "accumulate_geometry"), "capture.hooks"), "CaptureError": "capture.refusals",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"dalign_core.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dalign_core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "EffectiveDims",
    "Geometry",
    "GeometryAccumulator",
    "accumulate_geometry",
    "activation_gradients",
    "alignment_mean",
    "alignment_variance",
    "b_align",
    "b_exact",
    "effective_dims",
    "estimate_geometry",
    "n_eff",
    "plugin_geometry",
]
