"""Estimate the alignment geometry of q from per-example samples, never forming the d x d covariance.

Given rows ``q_1, ..., q_n`` (a matrix ``Q`` of shape ``(n, d)``), every quantity the
bounds need is a sum of products of Gram entries ``G_ij = q_i^T q_j`` over
*distinct* indices, so the unbiased U-statistics below cost one ``n x n`` Gram
matrix (``O(n^2 d)`` time, ``O(n^2)`` memory) and no ``d x d`` matrix:

* ``||mu||^2``          = mean over i != j of ``G_ij``
* ``||mu||^4``          = mean over distinct i, j, k, l of ``G_ij G_kl``
* ``mu^T Sigma mu``     = mean over distinct i, j, k of ``G_ij G_jk``  minus ``||mu||^4``
* ``tr(Sigma^2)``       = mean over i != j of ``G_ij^2`` - 2 (mean of ``G_ij G_jk``) + ``||mu||^4``

(``E[G_ij G_jk] = mu^T (Sigma + mu mu^T) mu`` and ``E[G_ij^2] = tr((Sigma + mu mu^T)^2)``.)
The sums over distinct indices follow from row sums of the off-diagonal Gram
matrix by inclusion-exclusion, so the whole estimate is ``O(n^2)`` after the Gram.
The plug-in ``tr(S^2)`` of the sample covariance, by contrast, is biased upward by
about ``tr(Sigma)^2 / n``, which dominates when d is large compared with n.

Confidence intervals come from the delete-one jackknife, whose ``n`` leave-one-out
estimates also follow from the same row sums in ``O(n^2)``.

For d too large to keep, ``sketch_dim=k`` replaces each row by a k-dimensional
CountSketch (each coordinate hashed to one of k buckets with a random sign).
Inner products stay unbiased; the estimates then describe the sketched geometry,
whose error shrinks as k grows: ``||mu||^2`` has relative error of order
``sqrt(2/k)`` and ``tr(Sigma^2)`` is inflated by about ``r/k`` relative, where
``r = tr(Sigma)^2 / tr(Sigma^2)`` is the covariance's effective rank, so choose
``k`` well above ``r`` (the theory chapter and ``tests/test_estimators.py`` measure this).

Scale: the dimensions are scale-invariant, the moments are not. Rows whose largest
``|entry|`` lies beyond ``2^±200`` (float64 gradients of 1e200 or 1e-170) are multiplied
by a power of two before the Gram is formed, and the Gram likewise before its
products, so nothing overflows or underflows; the moments are scaled back at the
end (exactly: powers of two). ``d_align`` and its interval are then those of the
rescaled rows; a moment that float64 cannot hold becomes ``inf`` or ``0``. Inside the
window nothing is rescaled, so ordinary inputs give bit-for-bit the same numbers.

Precision: float32 rows (what capture gives) with ``n^2 d >= 2^30`` are multiplied in float32, over the upper
triangle of row tiles, and the partial products summed in float64 (:func:`~dalign_core.geometry.rows.float32_gram`,
about 4x faster than the float64 product on a CPU), where the rows' estimated ``||mu||^2`` is at most their
``tr(Sigma)``: there every moment and dimension lies within a millionth of its own standard error of the float64
result (tests/test_gram_precision.py; the bound tested is a hundredth). Larger means, float64 rows, rows near
float32's range, smaller Grams and reduced-precision float32 matmul settings (TF32) keep the float64 product,
and ``precision="float64"`` asks for it everywhere.

Here: :func:`estimate_geometry` (one shot) and :func:`plugin_geometry` (the biased
comparison). The pieces: :mod:`dalign_core.geometry.rows` (checked rows, scaling, the
blocked Gram product, :class:`~dalign_core.geometry.rows.CountSketch`),
:mod:`dalign_core.geometry.ustatistics` (the U-statistics, the jackknife,
:class:`~dalign_core.geometry.ustatistics.Geometry`) and
:mod:`dalign_core.geometry.accumulator` (the streamed
:class:`~dalign_core.geometry.accumulator.GeometryAccumulator`).
"""

from __future__ import annotations

import math

import torch

from dalign_core.geometry.accumulator import GeometryAccumulator
from dalign_core.geometry.bounds import dims_tensor
from dalign_core.geometry.rows import (
    FLOAT32_MIN_WORK,
    check_precision,
    check_sketch_dim,
    checked_rows,
    scale_exponent,
    as_rows,
    float32_gram,
    float32_mean_ratio_allows,
    float32_products_allowed,
    gram_product,
)
from dalign_core.geometry.ustatistics import Geometry, check_confidence, check_n, geometry_from_scaled_gram

__all__ = ["estimate_geometry", "plugin_geometry"]


def estimate_geometry(
    Q, *, sketch_dim: int | None = None, seed: int = 0, confidence: float = 0.95, precision: str = "auto"
) -> Geometry:
    """Unbiased estimate of the alignment geometry from per-example gradients ``Q`` of shape ``(n, d)``.

    Runs on ``Q``'s device and never forms a ``d x d`` matrix: the ``(n, n)`` Gram
    matrix is accumulated over column blocks of Q in float64, so n up to ~20,000 and d
    up to ~10^6 work whenever Q itself fits. Every estimate comes with a delete-one
    jackknife interval at level ``confidence``. ``sketch_dim=k`` (``k <= d``) estimates
    from a k-dimensional CountSketch of the rows instead (see the module docstring).
    Rows of any scale work: see "Scale" in the module docstring.

    ``precision="auto"`` forms the Gram matrix of float32 (or half-precision) rows with ``n^2 d >= 2^30`` from
    symmetric float32 products summed in float64 (:func:`~dalign_core.geometry.rows.float32_gram`, about 4x
    faster than float64 on a CPU) where the rows' mean is small against their noise
    (:data:`~dalign_core.geometry.rows.FLOAT32_MAX_MEAN_RATIO`; there every moment agrees with the float64
    result to far below a hundredth of its standard error), and in float64 everywhere else; ``"float64"``
    always multiplies in float64.

    Raises:
        ValueError: n < 4, rows containing NaN or inf (with their count), sketch_dim < 1 or > d, an unknown
            precision.
        TypeError: complex numbers, strings or other non-numbers in Q; a sketch_dim that is not an integer.
    """
    check_sketch_dim(sketch_dim)
    check_confidence(confidence)
    check_precision(precision)
    Q, peak = checked_rows(Q, "Q")
    check_n(Q.shape[0])
    if sketch_dim is not None:
        return GeometryAccumulator(sketch_dim=sketch_dim, seed=seed, precision=precision).update(Q).result(confidence)
    exponent = scale_exponent(peak)
    G = None
    n, d = Q.shape
    if precision == "auto" and n * n * d >= FLOAT32_MIN_WORK and float32_products_allowed(Q.dtype, peak, Q.device):
        G = float32_gram(Q)
        if not float32_mean_ratio_allows(G):
            G = None  # a large mean against the noise: float32's rounding is not negligible there
    if G is None:
        G = gram_product(Q, Q, scale=math.ldexp(1.0, -exponent))
    return geometry_from_scaled_gram(G, 2 * exponent, Q.shape[1], confidence=confidence, sketch_dim=None)


def plugin_geometry(Q) -> Geometry:
    """The plug-in estimate (sample mean and sample covariance), for comparison only.

    Forms the ``d x d`` sample covariance ``S`` explicitly; ``tr(S^2)`` is biased
    upward by about ``tr(Sigma)^2 / n`` and ``||mu_hat||^2`` by ``tr(Sigma) / n``.
    No intervals are reported.
    """
    Q = as_rows(Q).to(torch.float64)
    n = Q.shape[0]
    check_n(n)
    mean = Q.mean(dim=0)
    centered = Q - mean
    cov = centered.T @ centered / (n - 1)
    mean_sq = float(mean @ mean)
    directional = float(mean @ (cov @ mean))
    cov_energy = float((cov * cov).sum())
    d_par, d_2, d_align = (float(v) for v in dims_tensor(*(torch.tensor(v, dtype=torch.float64) for v in (
        mean_sq * mean_sq, directional, cov_energy))))
    return Geometry(
        n=n, d=Q.shape[1], mean_sq=mean_sq, mean_sq_sq=mean_sq * mean_sq, directional=directional,
        cov_energy=cov_energy, d_par=d_par, d_2=d_2, d_align=d_align, method="plug-in",
    )
