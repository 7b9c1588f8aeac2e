"""The geometry of per-example gradients, with no model and no file in sight.

* :mod:`~dalign_core.geometry.bounds`: exact moments, effective dimensions, B_exact and B_align.
* :mod:`~dalign_core.geometry.estimators`: the one-shot estimate from per-example gradients (and the plug-in).
* :mod:`~dalign_core.geometry.rows`: checked rows, power-of-two scaling, the blocked Gram product, CountSketch.
* :mod:`~dalign_core.geometry.ustatistics`: unbiased Gram U-statistics and their jackknife intervals (``Geometry``).
* :mod:`~dalign_core.geometry.accumulator`: the streamed estimate, batch by batch (``GeometryAccumulator``).
* :mod:`~dalign_core.geometry.misalignment`: Pr(μ_Mᵀg_K ≤ 0) by resampling, with Wilson intervals.
* :mod:`~dalign_core.geometry.synthetic`: synthetic gradient laws of known geometry (the theory chapter's checks).

May import: torch, numpy and :mod:`dalign_core._tensor`. Nothing else of the library.
"""
