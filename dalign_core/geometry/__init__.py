"""The geometry of per-example gradients, with no model and no file in sight.

* :mod:`~dalign_core.geometry.bounds`: exact moments, effective dimensions, B_exact and B_align.
* :mod:`~dalign_core.geometry.estimators`: unbiased Gram U-statistics from per-example gradients, streamed.
* :mod:`~dalign_core.geometry.misalignment`: Pr(μ_Mᵀg_K ≤ 0) by resampling, with Wilson intervals.
* :mod:`~dalign_core.geometry.synthetic`: synthetic gradient laws of known geometry (the theory chapter's checks).

May import: torch, numpy and :mod:`dalign_core._tensor`. Nothing else of the library.
"""
