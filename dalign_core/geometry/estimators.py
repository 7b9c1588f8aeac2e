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
"""

from __future__ import annotations

import math
import numbers
import statistics
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from dalign_core.geometry.bounds import b_align, b_exact_from_moments, dims_tensor

__all__ = [
    "Interval",
    "Geometry",
    "GeometryAccumulator",
    "CountSketch",
    "as_rows",
    "gram_product",
    "estimate_geometry",
    "geometry_from_gram",
    "geometry_from_row_statistics",
    "row_statistics",
    "plugin_geometry",
]

MOMENTS = ("mean_sq", "mean_sq_sq", "directional", "cov_energy")
DIMENSIONS = ("d_par", "d_2", "d_align")
_COLUMN_ELEMENTS = 1 << 24  # float64 elements per column block: 128 MiB


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


# ---------------------------------------------------------------------------
# Input handling


def as_rows(Q, name: str = "Q") -> torch.Tensor:
    """``Q`` as a 2-D floating tensor ``(n, d)`` on its own device (no copy for float tensors).

    numpy arrays of real numbers of any dtype are taken (integers and booleans as
    float64, ``longdouble`` as float64 when in range, views with negative strides or
    another byte order as a copy, object arrays whose entries are all real numbers).
    Raises TypeError naming ``name`` for complex numbers, strings or other non-numbers,
    and ValueError for a wrong shape or for rows holding NaN or inf.
    """
    return _checked_rows(Q, name)[0]


def _complex_message(name: str, dtype) -> str:
    return (f"{name} is complex ({dtype}); d_align is defined for real gradients and the imaginary part would be "
            f"lost. Pass {name}.real (or stack the real and imaginary parts as columns) if that is what you mean")


def _numpy_rows(Q: np.ndarray, name: str) -> torch.Tensor:
    """A numpy array of real numbers as a tensor (a copy where torch cannot share the memory)."""
    kind = Q.dtype.kind
    if kind == "c":
        raise TypeError(_complex_message(name, Q.dtype))
    if kind == "O":
        for index, value in np.ndenumerate(Q):
            if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
                raise TypeError(_complex_message(name, f"an object array holding {value!r} at index {index}"))
            if not isinstance(value, numbers.Number):
                raise TypeError(f"{name} is an object array holding {type(value).__name__} {value!r} at index "
                                f"{index}; it must hold real numbers (convert it with np.asarray({name}, dtype=float))")
        return torch.from_numpy(np.asarray(Q, dtype=np.float64))
    if kind in "biu":
        return torch.from_numpy(np.asarray(Q, dtype=np.float64))
    if kind != "f":
        hint = " (if the strings are numbers, convert them with .astype(float))" if kind in "US" else ""
        raise TypeError(f"{name} must hold real numbers, got numpy dtype {Q.dtype}{hint}")
    if Q.dtype.itemsize > 8:  # longdouble: float64 holds every value in its range
        with np.errstate(over="ignore"):
            converted = Q.astype(np.float64)
        beyond = np.isfinite(Q) & ~np.isfinite(converted)
        if beyond.any():
            raise ValueError(f"{name} ({Q.dtype}) holds {int(beyond.sum())} value(s) beyond float64's range, e.g. "
                             f"{Q[beyond].flat[0]}; divide {name} by a power of two first (d_align does not "
                             "depend on the scale)")
        return torch.from_numpy(converted)
    if not Q.dtype.isnative or any(stride < 0 for stride in Q.strides):  # torch cannot share this memory
        Q = np.ascontiguousarray(Q, dtype=Q.dtype.newbyteorder("="))
    return torch.from_numpy(Q)


def _checked_rows(Q, name: str) -> tuple[torch.Tensor, float]:
    """:func:`as_rows` and the largest ``|entry|`` of ``Q`` (0 for an empty Q), found in the same pass."""
    if isinstance(Q, np.ndarray):
        Q = _numpy_rows(Q, name)
    if not isinstance(Q, torch.Tensor):
        raise TypeError(f"{name} must be a numpy array or torch tensor of shape (n, d), got {type(Q).__name__}")
    Q = Q.detach()
    if Q.is_complex():
        raise TypeError(_complex_message(name, Q.dtype))
    if Q.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d) (one row per example), got shape {tuple(Q.shape)}")
    if not Q.is_floating_point():
        Q = Q.to(torch.float64)
    bad = torch.zeros(Q.shape[0], dtype=torch.bool, device=Q.device)
    peak = torch.zeros((), dtype=torch.float64, device=Q.device)
    step = _column_block(Q.shape[0])
    for start in range(0, Q.shape[1] if Q.shape[0] else 0, step):  # in column blocks: no (n, d) temporary
        block = Q[:, start:start + step]
        bad |= ~torch.isfinite(block).all(dim=1)
        peak = torch.maximum(peak, block.abs().amax().to(torch.float64))
    bad_rows = int(bad.sum())
    if bad_rows:
        raise ValueError(
            f"{name} has {bad_rows} row(s) with NaN or inf out of {Q.shape[0]}; "
            "drop those examples (or find why their loss or gradient overflowed) before estimating"
        )
    return Q, float(peak)


_SAFE_EXPONENT = 200
"""Rows (and Gram matrices) whose largest ``|entry|`` lies in ``[2^-200, 2^200]`` are used as they are."""


def _scale_exponent(peak: float) -> int:
    """0 when ``peak`` is 0 or within ``2^±_SAFE_EXPONENT``, else ``e`` with ``peak * 2^-e`` in ``[0.5, 1)``."""
    if peak == 0.0 or not math.isfinite(peak):
        return 0
    exponent = math.frexp(peak)[1]
    if -_SAFE_EXPONENT <= exponent <= _SAFE_EXPONENT:
        return 0
    return max(-1000, min(1000, exponent))  # 2^-e stays a normal float64


def _times_pow2_(t: torch.Tensor, exponent: int) -> torch.Tensor:
    """Multiply ``t`` in place by ``2^exponent`` (in steps a float64 scalar can hold)."""
    while exponent:
        step = max(-1000, min(1000, exponent))
        t.mul_(math.ldexp(1.0, step))
        exponent -= step
    return t


def _times_pow2(x: float, exponent: int) -> float:
    """``x * 2^exponent``; ``inf`` (or 0) where float64 cannot hold the result."""
    if exponent == 0:
        return x
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(np.float64(x), exponent))


def _check_sketch_dim(sketch_dim, d: int | None = None) -> None:
    if sketch_dim is None:
        return
    if isinstance(sketch_dim, bool) or not isinstance(sketch_dim, numbers.Integral):
        raise TypeError(f"sketch_dim must be a positive integer or None, got {type(sketch_dim).__name__} "
                        f"{sketch_dim!r}")
    if sketch_dim < 1:
        raise ValueError(f"sketch_dim must be a positive integer, got {sketch_dim}")
    if d is not None and sketch_dim > d:
        raise ValueError(f"sketch_dim={sketch_dim} is larger than the rows' dimension d={d}; a CountSketch only "
                         "saves memory with sketch_dim < d (and is exact in no case): leave sketch_dim=None to "
                         f"estimate from the rows themselves, or choose sketch_dim <= {d}")


def _check_n(n: int) -> None:
    if n < 4:
        raise ValueError(
            f"need at least 4 examples for the unbiased U-statistics (they average over 4 distinct examples), got n={n}"
        )


def _column_block(rows: int) -> int:
    return max(1, _COLUMN_ELEMENTS // max(rows, 1))


def _row_block(columns: int) -> int:
    return max(1, _COLUMN_ELEMENTS // max(columns, 1))


def gram_product(A: torch.Tensor, B: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
    """``(scale A) (scale B)^T`` in float64, ``(a, d) x (b, d) -> (a, b)``, on A's device.

    Accumulated over column blocks so that only one float64 slice of each input
    exists at a time: float32 rows of any d need little extra memory. ``scale`` (a
    power of two, to keep huge or tiny rows in range) multiplies each slice.
    """
    out = torch.zeros(A.shape[0], B.shape[0], dtype=torch.float64, device=A.device)
    step = _column_block(A.shape[0] + B.shape[0])
    for start in range(0, A.shape[1], step):
        a = A[:, start:start + step].to(torch.float64)
        b = B[:, start:start + step].to(device=A.device, dtype=torch.float64)
        if scale != 1.0:
            a, b = a * scale, b * scale
        out.addmm_(a, b.T)
    return out


# ---------------------------------------------------------------------------
# Sketching


class CountSketch:
    """A fixed random CountSketch ``R^d -> R^k``: coordinate j goes to bucket ``h(j)`` with sign ``s(j)``.

    ``sketch(x)^T sketch(y)`` is an unbiased estimate of ``x^T y``. The hash and signs
    are drawn once from ``seed``; applying the sketch costs ``O(n d)``.
    """

    def __init__(self, d: int, k: int, seed: int = 0):
        _check_sketch_dim(k, d)
        generator = torch.Generator().manual_seed(seed)
        self.d, self.k = d, k
        self.bucket = torch.randint(0, k, (d,), generator=generator)
        self.sign = torch.randint(0, 2, (d,), generator=generator).to(torch.float64) * 2 - 1

    def __call__(self, rows: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        """Sketch ``scale * rows`` (rows of shape ``(n, d)``) to ``(n, k)`` (float64, on ``rows``' device)."""
        if rows.shape[1] != self.d:
            raise ValueError(f"rows have dimension {rows.shape[1]}, the sketch was built for {self.d}")
        bucket, sign = self.bucket.to(rows.device), self.sign.to(rows.device)
        out = torch.zeros(rows.shape[0], self.k, dtype=torch.float64, device=rows.device)
        step = _column_block(rows.shape[0])
        for start in range(0, self.d, step):
            block = rows[:, start:start + step].to(torch.float64) * sign[start:start + step]
            if scale != 1.0:
                block = block * scale
            out.index_add_(1, bucket[start:start + step], block)
        return out


# ---------------------------------------------------------------------------
# U-statistics from the Gram matrix


def row_statistics(G: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-row numbers every U-statistic below needs from an ``(n, n)`` Gram matrix: four ``(n,)`` vectors.

    ``diag`` (``G_jj``), ``row`` (``r_j = sum_{i != j} G_ij``), ``row_sq`` (``c_j = sum_{i != j} G_ij^2``) and
    ``gram_row`` (``(G r)_j``). Row j's entries come from row j of G alone (``gram_row`` also from ``r``), so
    processes that each hold some rows of G can compute theirs and gather the vectors
    (:func:`dalign_core.training.distributed.sharded_geometry`).
    """
    diag = torch.diagonal(G)
    # H = G with a zero diagonal is never formed: at n = 20,000 each n x n copy costs 3.2 GB.
    row = G.sum(dim=1) - diag
    row_sq = torch.cat([(block * block).sum(dim=1) for block in G.split(_row_block(G.shape[1]))]) - diag * diag
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
        raise TypeError(_complex_message("G", G.dtype))
    given = torch.as_tensor(G)
    G = given.to(torch.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"G must be a square (n, n) Gram matrix, got shape {tuple(G.shape)}")
    _check_gram_entries(G, given.dtype)
    return _geometry_from_scaled_gram(G, 0, d, confidence=confidence, sketch_dim=sketch_dim)


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


def _geometry_from_scaled_gram(
    G: torch.Tensor, exponent: int, d: int | None, *, confidence: float, sketch_dim: int | None
) -> Geometry:
    """The geometry of the Gram matrix ``G * 2^exponent`` (``G`` float64, never modified)."""
    _check_confidence(confidence)
    _check_n(G.shape[0])
    low, high = torch.aminmax(G)
    shift = _scale_exponent(max(-float(low), float(high)))  # keeps the products of Gram entries in range
    if shift:
        G = _times_pow2_(G.clone(), -shift)
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
    _check_confidence(confidence)
    n = int(stats["row"].shape[0])
    _check_n(n)
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
            values[name] = _times_pow2(values[name], k)
            i = intervals[name]
            intervals[name] = Interval(*(_times_pow2(x, k) for x in (i.estimate, i.se, i.lo, i.hi)))
    return Geometry(
        n=n, d=-1 if d is None else int(d), sketch_dim=sketch_dim, confidence=confidence, intervals=intervals, **values
    )


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")


# ---------------------------------------------------------------------------
# Streaming and one-shot estimation


class GeometryAccumulator:
    """Streaming estimator: feed batches of q rows as they come off backward passes.

    ``update(rows)`` takes a ``(b, d)`` batch; ``result()`` returns the same
    :class:`Geometry` as :func:`estimate_geometry` on all rows stacked (to float
    rounding). The exact U-statistics need every pairwise inner product, so the
    accumulator keeps the rows it has seen (or, with ``sketch_dim=k``, only their
    k-dimensional sketches) plus the growing Gram matrix; buffers grow by doubling.

    Args:
        sketch_dim: keep k-dimensional CountSketches instead of the rows (for huge d; ``k <= d``).
        seed: seed of the sketch.
        device: where the Gram matrix and the kept rows live (default: the first batch's device).
        dtype: dtype of the kept rows (default: float64 for float64 batches, float32 for any
            other, so float16 or bfloat16 rows are kept in float32; products are always
            accumulated in float64).
    """

    def __init__(self, *, sketch_dim: int | None = None, seed: int = 0, device=None, dtype: torch.dtype | None = None):
        _check_sketch_dim(sketch_dim)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch dtype (e.g. torch.float32) or None, got {dtype!r}")
        self.sketch_dim, self.seed = sketch_dim, seed
        self.device = None if device is None else torch.device(device)
        self.dtype = dtype
        self._fixed_dtype = dtype is not None
        self._sketch: CountSketch | None = None
        self._rows: torch.Tensor | None = None
        self._gram: torch.Tensor | None = None
        self._peak = 0.0  # the largest |entry| of the rows given so far
        self._exponent = 0  # the kept rows (and sketches) are the given ones times 2^-_exponent
        self.n = 0
        self.d: int | None = None

    def _grow(self, needed: int) -> None:
        capacity = 0 if self._rows is None else self._rows.shape[0]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity, 64)
        rows = torch.empty(new_capacity, self._width, dtype=self.dtype, device=self.device)
        gram = torch.zeros(new_capacity, new_capacity, dtype=torch.float64, device=self.device)
        if self._rows is not None:
            rows[: self.n] = self._rows[: self.n]
            gram[: self.n, : self.n] = self._gram[: self.n, : self.n]
        self._rows, self._gram = rows, gram

    def _rescale(self, peak: float) -> None:
        """Take a batch whose largest |entry| is ``peak``: rescale what is kept if the rows' range demands it."""
        self._peak = max(self._peak, peak)
        exponent = _scale_exponent(self._peak)
        if exponent != self._exponent and self.n:
            shift = exponent - self._exponent
            _times_pow2_(self._rows[: self.n], -shift)
            _times_pow2_(self._gram[: self.n, : self.n], -2 * shift)
        self._exponent = exponent

    def update(self, rows) -> "GeometryAccumulator":
        """Add a batch of rows of shape ``(b, d)``; returns ``self``."""
        batch, peak = _checked_rows(rows, "rows")
        if self.d is None:
            _check_sketch_dim(self.sketch_dim, batch.shape[1])
            self.d = batch.shape[1]
            self.device = self.device or batch.device
            if self.sketch_dim is not None:
                self._sketch = CountSketch(self.d, self.sketch_dim, self.seed)
                self.dtype = self.dtype or torch.float64
            else:
                self.dtype = self.dtype or _kept_dtype(batch.dtype)
            self._width = self.sketch_dim or self.d
        elif batch.shape[1] != self.d:
            raise ValueError(f"rows have dimension {batch.shape[1]}, earlier batches had {self.d}")
        if batch.shape[0] == 0:
            return self
        if not self._fixed_dtype and self._sketch is None:  # a float64 batch after float32 ones: keep float64
            wider = torch.promote_types(self.dtype, _kept_dtype(batch.dtype))
            if wider != self.dtype:
                self.dtype = wider
                if self._rows is not None:
                    self._rows = self._rows.to(wider)
        self._rescale(peak)
        scale = math.ldexp(1.0, -self._exponent)
        batch = batch.to(self.device)
        b, start = batch.shape[0], self.n
        self._grow(start + b)
        kept = self._rows[start:start + b]
        if self._sketch is not None:
            kept.copy_(self._sketch(batch, scale=scale))
        elif scale == 1.0:
            kept.copy_(batch)
        else:  # scaled in float64, by column blocks (float64 rows of 1e200 would overflow float32 unscaled)
            step = _column_block(b)
            for column in range(0, self.d, step):
                kept[:, column:column + step] = batch[:, column:column + step].to(torch.float64) * scale
        cross = gram_product(kept, self._rows[:start]) if start else None
        block = gram_product(kept, kept)
        self._gram[start:start + b, start:start + b] = block
        if cross is not None:
            self._gram[start:start + b, :start] = cross
            self._gram[:start, start:start + b] = cross.T
        self.n = start + b
        return self

    def gram(self) -> torch.Tensor:
        """The ``(n, n)`` float64 Gram matrix of the rows seen so far (of their sketches, if sketching)."""
        if self._gram is None:
            return torch.zeros(0, 0, dtype=torch.float64)
        gram = self._gram[: self.n, : self.n]
        return _times_pow2_(gram.clone(), 2 * self._exponent) if self._exponent else gram

    def rows(self) -> torch.Tensor:
        """The kept rows, shape ``(n, d)`` (or ``(n, k)`` sketches)."""
        if self._rows is None:
            return torch.zeros(0, 0)
        rows = self._rows[: self.n]
        return _times_pow2_(rows.to(torch.float64), self._exponent) if self._exponent else rows

    def result(self, confidence: float = 0.95) -> Geometry:
        """The estimated :class:`Geometry` with jackknife intervals at level ``confidence``."""
        _check_n(self.n)
        return _geometry_from_scaled_gram(self._gram[: self.n, : self.n], 2 * self._exponent, self.d,
                                          confidence=confidence, sketch_dim=self.sketch_dim)


def _kept_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 rows are kept in float64, any other floating rows in float32 (float16 would overflow)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def estimate_geometry(Q, *, sketch_dim: int | None = None, seed: int = 0, confidence: float = 0.95) -> Geometry:
    """Unbiased estimate of the alignment geometry from per-example gradients ``Q`` of shape ``(n, d)``.

    Runs on ``Q``'s device and never forms a ``d x d`` matrix: the ``(n, n)`` Gram
    matrix is accumulated over column blocks of Q in float64, so n up to ~20,000 and d
    up to ~10^6 work whenever Q itself fits. Every estimate comes with a delete-one
    jackknife interval at level ``confidence``. ``sketch_dim=k`` (``k <= d``) estimates
    from a k-dimensional CountSketch of the rows instead (see the module docstring).
    Rows of any scale work: see "Scale" in the module docstring.

    Raises:
        ValueError: n < 4, rows containing NaN or inf (with their count), sketch_dim < 1 or > d.
        TypeError: complex numbers, strings or other non-numbers in Q; a sketch_dim that is not an integer.
    """
    _check_sketch_dim(sketch_dim)
    _check_confidence(confidence)
    Q, peak = _checked_rows(Q, "Q")
    _check_n(Q.shape[0])
    if sketch_dim is not None:
        return GeometryAccumulator(sketch_dim=sketch_dim, seed=seed).update(Q).result(confidence)
    exponent = _scale_exponent(peak)
    G = gram_product(Q, Q, scale=math.ldexp(1.0, -exponent))
    return _geometry_from_scaled_gram(G, 2 * exponent, Q.shape[1], confidence=confidence, sketch_dim=None)


def plugin_geometry(Q) -> Geometry:
    """The plug-in estimate (sample mean and sample covariance), for comparison only.

    Forms the ``d x d`` sample covariance ``S`` explicitly; ``tr(S^2)`` is biased
    upward by about ``tr(Sigma)^2 / n`` and ``||mu_hat||^2`` by ``tr(Sigma) / n``.
    No intervals are reported.
    """
    Q = as_rows(Q).to(torch.float64)
    n = Q.shape[0]
    _check_n(n)
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
