"""dalign_core: measure the effective alignment dimension d_align of activation gradients.

The bottom of the library knows nothing of models or files:

* :mod:`dalign_core.geometry.bounds` — exact moments, effective dimensions, B_exact and B_align.
* :mod:`dalign_core.geometry.estimators` — unbiased Gram U-statistics from per-example gradients.

Beside them, :mod:`dalign_repro.config` holds the profiles (smoke, cpu, gpu, paper),
the repository root and the experiments' config base class, and
:mod:`dalign_core.atomic` the atomic file writes. Above them,
:mod:`dalign_repro.report.results` writes results with provenance and
:mod:`dalign_repro.experiments` ties data, models and estimators together.
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
