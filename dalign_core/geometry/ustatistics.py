"""The unbiased U-statistics of the alignment geometry from a Gram matrix, and their jackknife intervals.

Given rows ``q_1, ..., q_n`` and their Gram matrix ``G_ij = q_i^T q_j``, every quantity
the bounds need is a sum of products of Gram entries over *distinct* indices:

* ``||mu||^2``          = mean over i != j of ``G_ij``
* ``||mu||^4``          = mean over distinct i, j, k, l of ``G_ij G_kl``
* ``mu^T Sigma mu``     = mean over distinct i, j, k of ``G_ij G_jk``  minus ``||mu||^4``
* ``tr(Sigma^2)``       = mean over i != j of ``G_ij^2`` - 2 (mean of ``G_ij G_jk``) + ``||mu||^4``

The sums over distinct indices follow from four row statistics of the off-diagonal
Gram matrix (:func:`row_statistics`) by inclusion-exclusion, so the whole estimate is
``O(n^2)`` after the Gram; the delete-one jackknife's ``n`` leave-one-out estimates
follow from the same row sums. :class:`Geometry` is the result (with its
:class:`Interval` s); :mod:`dalign_core.geometry.estimators` says why these and not the
plug-in moments.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from dalign_core.geometry.bounds import b_align, b_exact_from_moments, dims_tensor
from dalign_core.geometry.rows import complex_message, row_block, scale_exponent, times_pow2, times_pow2_

__all__ = ["Interval", "Geometry", "geometry_from_gram", "geometry_from_row_statistics", "row_statistics", "check_n",
           "geometry_from_scaled_gram", "check_confidence"]

MOMENTS = ("mean_sq", "mean_sq_sq", "directional", "cov_energy")
DIMENSIONS = ("d_par", "d_2", "d_align")


@dataclass(frozen=True)
class Interval:
    """A point estimate with its jackknife standard error and a normal-approximation interval."""

    estimate: float
    se: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Geometry:
    """Estimated geometry of q from n examples of dimension d.

    Moments: ``mean_sq`` = ||mu||^2, ``mean_sq_sq`` = ||mu||^4, ``directional`` =
    mu^T Sigma mu, ``cov_energy`` = tr(Sigma^2) (units: squared units of q, raised to
    the moment's degree). Dimensions ``d_par``, ``d_2``, ``d_align`` are
    dimensionless. ``intervals`` maps each of these names to an :class:`Interval`
    (empty for the plug-in estimator).
    """

    n: int
    d: int
    mean_sq: float
    mean_sq_sq: float
    directional: float
    cov_energy: float
    d_par: float
    d_2: float
    d_align: float
    method: str = "u-statistic"
    sketch_dim: int | None = None
    confidence: float | None = None
    intervals: Mapping[str, Interval] = field(default_factory=dict)

    def b_exact(self, M, K) -> float:
        """Cantelli certificate for budgets M, K from the estimated moments."""
        return b_exact_from_moments(self.mean_sq_sq, self.directional, self.cov_energy, M, K)

    def b_align(self, M, K) -> float:
        """``1 / (1 + n_eff(M, K) d_align)`` from the estimated ``d_align``."""
        return b_align(self.d_align, M, K)

    def to_row(self) -> dict[str, float | int | str | None]:
        """A flat dict for a tidy table: every estimate, and ``<name>_lo``/``<name>_hi``/``<name>_se``."""
        row: dict[str, float | int | str | None] = {
            "n": self.n, "d": self.d, "method": self.method, "sketch_dim": self.sketch_dim,
        }
        for name in MOMENTS + DIMENSIONS:
            row[name] = getattr(self, name)
            if name in self.intervals:
                interval = self.intervals[name]
                row[f"{name}_lo"], row[f"{name}_hi"], row[f"{name}_se"] = interval.lo, interval.hi, interval.se
        return row


def check_n(n: int) -> None:
    """Raise ValueError unless there are at least 4 examples (the U-statistics average over 4 distinct ones)."""
    if n < 4:
        raise ValueError(
            f"need at least 4 examples for the unbiased U-statistics (they average over 4 distinct examples), got n={n}"
        )


# ---------------------------------------------------------------------------
# U-statistics from the Gram matrix


def row_statistics(G: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-row numbers every U-statistic below needs from an ``(n, n)`` Gram matrix: four ``(n,)`` vectors.

    ``diag`` (``G_jj``), ``row`` (``r_j = sum_{i != j} G_ij``), ``row_sq`` (``c_j = sum_{i != j} G_ij^2``) and
    ``gram_row`` (``(G r)_j``). Row j's entries come from row j of G alone (``gram_row`` also from ``r``), so
    processes that each hold some rows of G can compute theirs and gather the vectors
    (:func:`dalign_repro.training.sharded.sharded_geometry`).
    """
    diag = torch.diagonal(G)
    # H = G with a zero diagonal is never formed: at n = 20,000 each n x n copy costs 3.2 GB.
    row = G.sum(dim=1) - diag
    row_sq = torch.cat([(block * block).sum(dim=1) for block in G.split(row_block(G.shape[1]))]) - diag * diag
    return {"diag": diag, "row": row, "row_sq": row_sq, "gram_row": G @ row}


def _distinct_sums(stats: "Mapping[str, torch.Tensor] | torch.Tensor") -> dict[str, torch.Tensor]:
    """Sums of Gram products over distinct indices, for all n and for each leave-one-out sample.

    Takes :func:`row_statistics` (or the Gram matrix itself). Returns tensors ``s, p2, p3, p4`` (scalars) and
    ``s_loo, p2_loo, p3_loo, p4_loo`` (shape ``(n,)``), where for the off-diagonal Gram ``H``:
    ``s = sum_{i!=j} H_ij``, ``p2 = sum_{i!=j} H_ij^2``,
    ``p3 = sum_{i,j,k distinct} H_ij H_jk``, ``p4 = sum_{i,j,k,l distinct} H_ij H_kl``.
    """
    if isinstance(stats, torch.Tensor):
        stats = row_statistics(stats)
    diag, row, row_sq = stats["diag"], stats["row"], stats["row_sq"]
    s, p2, sum_row_sq = row.sum(), row_sq.sum(), (row * row).sum()
    p3 = sum_row_sq - p2
    p4 = s * s - 4.0 * p3 - 2.0 * p2
    # Removing example m: row sums lose H_jm, so sum_j r_j^2 loses r_m^2 + 2 (H r)_m - c_m.
    s_loo = s - 2.0 * row
    p2_loo = p2 - 2.0 * row_sq
    p3_loo = (sum_row_sq - row * row - 2.0 * (stats["gram_row"] - diag * row) + row_sq) - p2_loo
    p4_loo = s_loo * s_loo - 4.0 * p3_loo - 2.0 * p2_loo
    return {"s": s, "p2": p2, "p3": p3, "p4": p4, "s_loo": s_loo, "p2_loo": p2_loo, "p3_loo": p3_loo, "p4_loo": p4_loo}


def _u_statistics(n: int, s, p2, p3, p4) -> dict[str, torch.Tensor]:
    """Unbiased moments from the distinct-index sums of n examples (works elementwise on tensors)."""
    pairs = n * (n - 1.0)
    triples = pairs * (n - 2.0)
    quads = triples * (n - 3.0)
    t2, t3, t4 = p2 / pairs, p3 / triples, p4 / quads
    moments = {"mean_sq": s / pairs, "mean_sq_sq": t4, "directional": t3 - t4, "cov_energy": t2 - 2.0 * t3 + t4}
    moments.update(zip(DIMENSIONS, dims_tensor(moments["mean_sq_sq"], moments["directional"], moments["cov_energy"])))
    return moments


def _jackknife(full: dict[str, torch.Tensor], loo: dict[str, torch.Tensor], n: int, confidence: float):
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    intervals = {}
    for name, estimate in full.items():
        values = loo[name]
        estimate = float(estimate)
        if not math.isfinite(estimate) or not bool(torch.isfinite(values).all()):
            intervals[name] = Interval(estimate, math.nan, math.nan, math.nan)
            continue
        se = math.sqrt((n - 1.0) / n * float(((values - values.mean()) ** 2).sum()))
        lo, hi = estimate - z * se, estimate + z * se
        if name in DIMENSIONS:  # dimensions are non-negative by definition
            lo = max(lo, 0.0)
        intervals[name] = Interval(estimate, se, lo, hi)
    return intervals


def geometry_from_gram(
    G, d: int | None = None, *, confidence: float = 0.95, sketch_dim: int | None = None
) -> Geometry:
    """Unbiased geometry and jackknife intervals from an ``(n, n)`` Gram matrix ``G_ij = q_i^T q_j``.

    ``d`` is recorded in the result only (the estimates do not need it).

    Raises:
        ValueError: a G that is not square, has NaN or inf entries, or is not symmetric beyond rounding
            (relative to its largest entry: :func:`_symmetry_tolerance`); n < 4.
        TypeError: a complex G.
    """
    if isinstance(G, np.ndarray) and G.dtype.kind == "c" or isinstance(G, torch.Tensor) and G.is_complex():
        raise TypeError(complex_message("G", G.dtype))
    given = torch.as_tensor(G)
    G = given.to(torch.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"G must be a square (n, n) Gram matrix, got shape {tuple(G.shape)}")
    _check_gram_entries(G, given.dtype)
    return geometry_from_scaled_gram(G, 0, d, confidence=confidence, sketch_dim=sketch_dim)


def _symmetry_tolerance(dtype: torch.dtype) -> float:
    """Largest ``|G_ij - G_ji|``, relative to the largest ``|G_ij|``, that is rounding in a Gram of this dtype.

    ``q_i^T q_j`` and ``q_j^T q_i`` summed in another order differ by about ``sqrt(d)`` units of rounding
    (``d`` up to 10^6: ~10^3 eps); 10^5 eps leaves a margin of 100: 2e-11 for float64, and for float32 (and
    lower precision) at most 1e-3. A matrix off by more is not a Gram matrix.
    """
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float64).eps
    return min(1e-3, 1e5 * eps)


def _check_gram_entries(G: torch.Tensor, dtype: torch.dtype) -> None:
    """Refuse a Gram matrix with NaN or inf entries, or one that is not symmetric beyond rounding."""
    bad = ~torch.isfinite(G)
    if bool(bad.any()):
        i, j = (int(k) for k in torch.nonzero(bad)[0])
        raise ValueError(f"G has {int(bad.sum())} NaN or inf entries (e.g. G[{i}, {j}] = {float(G[i, j])}); drop "
                         "the examples whose gradients overflowed, or recompute the Gram matrix, before estimating")
    scale = float(G.abs().max()) if G.numel() else 0.0
    asymmetry = float((G - G.T).abs().max()) if G.numel() else 0.0
    tolerance = _symmetry_tolerance(dtype)
    if asymmetry > tolerance * scale:
        i, j = (int(k) for k in torch.nonzero((G - G.T).abs() == asymmetry)[0])
        raise ValueError(
            f"G is not symmetric: G[{i}, {j}] = {float(G[i, j]):.6g} but G[{j}, {i}] = {float(G[j, i]):.6g} (largest "
            f"difference {asymmetry / scale:.2g} of the largest entry, beyond rounding at {tolerance:.1g}); a Gram "
            "matrix G_ij = q_i^T q_j is symmetric: pass Q @ Q.T (or (G + G.T) / 2 if the difference is rounding)"
        )


def geometry_from_scaled_gram(
    G: torch.Tensor, exponent: int, d: int | None, *, confidence: float, sketch_dim: int | None
) -> Geometry:
    """The geometry of the Gram matrix ``G * 2^exponent`` (``G`` float64, never modified)."""
    check_confidence(confidence)
    check_n(G.shape[0])
    low, high = torch.aminmax(G)
    shift = scale_exponent(max(-float(low), float(high)))  # keeps the products of Gram entries in range
    if shift:
        G = times_pow2_(G.clone(), -shift)
    return _geometry_from_stats(row_statistics(G), exponent + shift, d, confidence=confidence, sketch_dim=sketch_dim)


def geometry_from_row_statistics(
    stats: Mapping[str, torch.Tensor], d: int | None = None, *, confidence: float = 0.95,
    sketch_dim: int | None = None,
) -> Geometry:
    """:func:`geometry_from_gram` from the Gram matrix's :func:`row_statistics` alone (four ``(n,)`` vectors)."""
    return _geometry_from_stats(stats, 0, d, confidence=confidence, sketch_dim=sketch_dim)


def _geometry_from_stats(
    stats: Mapping[str, torch.Tensor], exponent: int, d: int | None, *, confidence: float,
    sketch_dim: int | None,
) -> Geometry:
    """The geometry from the row statistics of a Gram matrix that is ``2^-exponent`` times the true one."""
    check_confidence(confidence)
    n = int(stats["row"].shape[0])
    check_n(n)
    sums = _distinct_sums({name: torch.as_tensor(value).to(torch.float64) for name, value in stats.items()})
    full = _u_statistics(n, sums["s"], sums["p2"], sums["p3"], sums["p4"])
    if n >= 5:
        loo = _u_statistics(n - 1, sums["s_loo"], sums["p2_loo"], sums["p3_loo"], sums["p4_loo"])
        intervals = _jackknife(full, loo, n, confidence)
    else:  # a leave-one-out sample of 3 has no 4-index U-statistic
        intervals = {name: Interval(float(v), math.nan, math.nan, math.nan) for name, v in full.items()}
    values = {name: float(v) for name, v in full.items()}
    if exponent:  # moments of degree 1 (mean_sq) and 2 in G scale back; the dimensions are scale-free
        for name in MOMENTS:
            k = exponent if name == "mean_sq" else 2 * exponent
            values[name] = times_pow2(values[name], k)
            i = intervals[name]
            intervals[name] = Interval(*(times_pow2(x, k) for x in (i.estimate, i.se, i.lo, i.hi)))
    return Geometry(
        n=n, d=-1 if d is None else int(d), sketch_dim=sketch_dim, confidence=confidence, intervals=intervals, **values
    )


def check_confidence(confidence: float) -> None:
    """Raise ValueError unless ``confidence`` lies strictly between 0 and 1."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
