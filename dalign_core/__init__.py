"""dalign_core: measure the effective alignment dimension d_align of activation gradients.

The bottom of the library knows nothing of models or files:

* :mod:`dalign_core.bounds` — exact moments, effective dimensions, B_exact and B_align.
* :mod:`dalign_core.estimators` — unbiased Gram U-statistics from per-example gradients.

Beside them, :mod:`dalign_core.config` holds the profiles (smoke, cpu, gpu, paper),
the repository root and the experiments' config base class, and
:mod:`dalign_core.atomic` the atomic file writes. Above them,
:mod:`dalign_core.results` writes results with provenance and
:mod:`dalign_core.experiments` ties data, models and estimators together.
"""

from dalign_core.bounds import (
    EffectiveDims,
    alignment_mean,
    alignment_variance,
    b_align,
    b_exact,
    effective_dims,
    n_eff,
)
from dalign_core.estimators import Geometry, GeometryAccumulator, estimate_geometry, plugin_geometry

__version__ = "0.1.0"

__all__ = [
    "EffectiveDims",
    "Geometry",
    "GeometryAccumulator",
    "alignment_mean",
    "alignment_variance",
    "b_align",
    "b_exact",
    "effective_dims",
    "estimate_geometry",
    "n_eff",
    "plugin_geometry",
]
