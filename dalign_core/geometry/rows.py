"""From rows of q to their Gram matrix: checked input, power-of-two scaling, blocked products, CountSketch.

Every estimate starts from rows ``q_1, ..., q_n`` (a matrix ``Q`` of shape ``(n, d)``):
:func:`as_rows` takes numpy arrays and torch tensors of real numbers and refuses the
rest in one sentence; :func:`gram_product` forms ``A B^T`` in float64 over column blocks
(only one float64 slice of each input at a time), so no ``d x d`` and no ``(n, d)``
float64 copy is made; :func:`float32_gram` forms it from float32 products summed in float64
where the estimators find that as accurate (:func:`float32_products_allowed`,
:func:`float32_mean_ratio_allows`).

Scale: rows whose largest ``|entry|`` lies beyond ``2^±200`` are multiplied by a power of
two before the Gram is formed (:func:`scale_exponent`, :func:`times_pow2_`), so
nothing overflows or underflows; inside the window nothing is rescaled.

For d too large to keep, :class:`CountSketch` maps each row to k buckets with random
signs: inner products stay unbiased (see :mod:`dalign_core.geometry.estimators`).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

__all__ = ["as_rows", "gram_product", "float32_gram", "CountSketch", "PRECISIONS", "check_precision",
           "check_sketch_dim", "checked_rows", "column_block", "scale_exponent", "times_pow2_", "complex_message",
           "row_block", "times_pow2"]

_COLUMN_ELEMENTS = 1 << 24  # float64 elements per column block: 128 MiB

PRECISIONS = ("auto", "float64")
"""``precision=`` of the estimators: ``"auto"`` forms large Gram matrices of float32 rows from float32 products
where that is as accurate as float64 (:func:`float32_products_allowed`, :func:`float32_mean_ratio_allows`);
``"float64"`` always multiplies in float64."""

FLOAT32_MIN_WORK = 1 << 30
"""``n^2 d`` from which a Gram matrix of float32 rows is formed from float32 products (below it the float64
product takes a tenth of a second or less, and small inputs keep float64's last digits)."""

FLOAT32_MAX_MEAN_RATIO = 1.0
"""Largest ``||mu||^2 / tr(Sigma)`` (estimated from the Gram matrix) at which float32 products are kept.

Rounding a product costs ``eps_32 (||mu||^2 + tr Sigma)`` relative to the entry, and the standard errors of the
moments shrink with the noise ``tr Sigma``: tests/test_gram_precision.py measures every moment within a
hundredth of its own standard error of the float64 result at ratios 1e-3 and 1 (worst case seen: 1e-5 of
an SE); at a ratio of 1000 the rounding reached 5e-2 of an SE of ``tr(Sigma^2)``, so such Grams are formed
again in float64."""

_FLOAT32_SAFE_EXPONENT = 40
"""float32 products only for rows whose largest ``|entry|`` lies in ``[2^-40, 2^40]``: the products of the
largest entries stay far from float32's overflow (2^128) and its subnormals (2^-126)."""

_FLOAT32_COLUMNS = 4096
"""Columns per float32 partial product; the partial products are summed in float64."""

_FLOAT32_TILE_ROWS = 128
"""Smallest row tile of the symmetric product (up to 8 tiles: the upper triangle of tiles costs 56% of a GEMM)."""


def as_rows(Q, name: str = "Q") -> torch.Tensor:
    """``Q`` as a 2-D floating tensor ``(n, d)`` on its own device (no copy for float tensors).

    numpy arrays of real numbers of any dtype are taken (integers and booleans as
    float64, ``longdouble`` as float64 when in range, views with negative strides or
    another byte order as a copy, object arrays whose entries are all real numbers).
    Raises TypeError naming ``name`` for complex numbers, strings or other non-numbers,
    and ValueError for a wrong shape or for rows holding NaN or inf.
    """
    return checked_rows(Q, name)[0]


def complex_message(name: str, dtype) -> str:
    """The error message for complex rows named ``name`` of ``dtype``: d_align is defined for real gradients."""
    return (f"{name} is complex ({dtype}); d_align is defined for real gradients and the imaginary part would be "
            f"lost. Pass {name}.real (or stack the real and imaginary parts as columns) if that is what you mean")


def _numpy_rows(Q: np.ndarray, name: str) -> torch.Tensor:
    """A numpy array of real numbers as a tensor (a copy where torch cannot share the memory)."""
    kind = Q.dtype.kind
    if kind == "c":
        raise TypeError(complex_message(name, Q.dtype))
    if kind == "O":
        for index, value in np.ndenumerate(Q):
            if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
                raise TypeError(complex_message(name, f"an object array holding {value!r} at index {index}"))
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


def checked_rows(Q, name: str) -> tuple[torch.Tensor, float]:
    """:func:`as_rows` and the largest ``|entry|`` of ``Q`` (0 for an empty Q), found in the same pass."""
    if isinstance(Q, np.ndarray):
        Q = _numpy_rows(Q, name)
    if not isinstance(Q, torch.Tensor):
        raise TypeError(f"{name} must be a numpy array or torch tensor of shape (n, d), got {type(Q).__name__}")
    Q = Q.detach()
    if Q.is_complex():
        raise TypeError(complex_message(name, Q.dtype))
    if Q.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d) (one row per example), got shape {tuple(Q.shape)}")
    if not Q.is_floating_point():
        Q = Q.to(torch.float64)
    if Q.numel() == 0:
        return Q, 0.0
    # One reduction pass (no temporary): NaN makes both ends NaN and inf shows at an end, so a finite minimum and
    # maximum mean finite rows; only then is each row looked at.
    low, high = (float(v) for v in torch.aminmax(Q))
    if math.isfinite(low) and math.isfinite(high):
        return Q, max(abs(low), abs(high))
    bad = torch.zeros(Q.shape[0], dtype=torch.bool, device=Q.device)
    step = column_block(Q.shape[0])
    for start in range(0, Q.shape[1], step):  # in column blocks: no (n, d) temporary
        bad |= ~torch.isfinite(Q[:, start:start + step]).all(dim=1)
    bad_rows = int(bad.sum())
    if bad_rows:
        raise ValueError(
            f"{name} has {bad_rows} row(s) with NaN or inf out of {Q.shape[0]}; "
            "drop those examples (or find why their loss or gradient overflowed) before estimating"
        )
    return Q, max(abs(low), abs(high))


_SAFE_EXPONENT = 200
"""Rows (and Gram matrices) whose largest ``|entry|`` lies in ``[2^-200, 2^200]`` are used as they are."""


def scale_exponent(peak: float) -> int:
    """0 when ``peak`` is 0 or within ``2^±_SAFE_EXPONENT``, else ``e`` with ``peak * 2^-e`` in ``[0.5, 1)``."""
    if peak == 0.0 or not math.isfinite(peak):
        return 0
    exponent = math.frexp(peak)[1]
    if -_SAFE_EXPONENT <= exponent <= _SAFE_EXPONENT:
        return 0
    return max(-1000, min(1000, exponent))  # 2^-e stays a normal float64


def times_pow2_(t: torch.Tensor, exponent: int) -> torch.Tensor:
    """Multiply ``t`` in place by ``2^exponent`` (in steps a float64 scalar can hold)."""
    while exponent:
        step = max(-1000, min(1000, exponent))
        t.mul_(math.ldexp(1.0, step))
        exponent -= step
    return t


def times_pow2(x: float, exponent: int) -> float:
    """``x * 2^exponent``; ``inf`` (or 0) where float64 cannot hold the result."""
    if exponent == 0:
        return x
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(np.float64(x), exponent))


def check_sketch_dim(sketch_dim, d: int | None = None) -> None:
    """Raise unless ``sketch_dim`` is None or a whole number from 1 to ``d`` (the row width, when known)."""
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


def column_block(rows: int) -> int:
    """How many columns of ``rows`` rows to convert at a time, so one float64 slice stays near the block size."""
    return max(1, _COLUMN_ELEMENTS // max(rows, 1))


def row_block(columns: int) -> int:
    """How many rows of ``columns`` columns to convert at a time, so one float64 slice stays near the block size."""
    return max(1, _COLUMN_ELEMENTS // max(columns, 1))


def gram_product(A: torch.Tensor, B: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
    """``(scale A) (scale B)^T`` in float64, ``(a, d) x (b, d) -> (a, b)``, on A's device.

    Accumulated over column blocks so that only one float64 slice of each input
    exists at a time: float32 rows of any d need little extra memory. ``scale`` (a
    power of two, to keep huge or tiny rows in range) multiplies each slice.
    """
    out = torch.zeros(A.shape[0], B.shape[0], dtype=torch.float64, device=A.device)
    step = column_block(A.shape[0] + B.shape[0])
    for start in range(0, A.shape[1], step):
        a = A[:, start:start + step].to(torch.float64)
        b = B[:, start:start + step].to(device=A.device, dtype=torch.float64)
        if scale != 1.0:
            a, b = a * scale, b * scale
        out.addmm_(a, b.T)
    return out


def float32_products_allowed(dtype: torch.dtype, peak: float, device) -> bool:
    """Whether rows of ``dtype`` whose largest ``|entry|`` is ``peak`` may be multiplied in float32 on ``device``.

    Only rows that float32 holds exactly (float32, float16, bfloat16), with ``peak`` in ``[2^-40, 2^40]`` (or 0),
    and only where float32 matrix products are IEEE float32 (no TF32 on a GPU, no bfloat16 inside a CPU product:
    ``torch.get_float32_matmul_precision() == "highest"`` and the backends' own switches off).
    """
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    if peak != 0.0 and not (2.0 ** -_FLOAT32_SAFE_EXPONENT <= peak <= 2.0 ** _FLOAT32_SAFE_EXPONENT):
        return False
    if torch.get_float32_matmul_precision() != "highest":
        return False
    device = torch.device(device)
    if device.type == "cuda":
        matmul = torch.backends.cuda.matmul
        if getattr(matmul, "fp32_precision", "none") not in ("none", "ieee"):
            return False
        if getattr(matmul, "fp32_precision", "none") == "none" and torch.backends.cuda.matmul.allow_tf32:
            return False
        return True
    if device.type == "cpu":
        mkldnn = getattr(torch.backends.mkldnn, "matmul", None)
        return getattr(mkldnn, "fp32_precision", "none") in ("none", "ieee")
    return False  # other accelerators: their float32 products are not known to be IEEE float32


def float32_mean_ratio_allows(G: torch.Tensor) -> bool:
    """Whether the Gram matrix ``G`` (float64, of ``n >= 2`` rows) lies where float32 products were shown accurate.

    Estimates ``||mu||^2`` (mean off-diagonal entry) and ``tr(Sigma)`` (mean diagonal entry less it) from G and
    asks ``||mu||^2 <= FLOAT32_MAX_MEAN_RATIO tr(Sigma)``.
    """
    n = G.shape[0]
    trace = float(torch.diagonal(G).sum())
    mean_sq = (float(G.sum()) - trace) / (n * (n - 1.0))
    noise = trace / n - mean_sq
    return noise > 0.0 and mean_sq <= FLOAT32_MAX_MEAN_RATIO * noise


def float32_gram(A: torch.Tensor, B: torch.Tensor | None = None) -> torch.Tensor:
    """``A B^T`` (``A A^T`` when ``B`` is None) from float32 products summed in float64: ``(a, d) x (b, d) -> (a, b)``.

    Each block of :data:`_FLOAT32_COLUMNS` columns is multiplied in float32 (``torch.mm``, so torch's thread count
    and device apply) and added to a float64 result, so float32's rounding never accumulates over more than that
    many terms. ``A A^T`` computes the upper triangle of up to 8 row tiles and mirrors it (about 56% of a GEMM's
    work). Rows in float16 or bfloat16 are widened to float32 one column block at a time. The caller checks
    :func:`float32_products_allowed`.
    """
    n = A.shape[0]
    m = n if B is None else B.shape[0]
    out = torch.zeros(n, m, dtype=torch.float64, device=A.device)
    tiles = max(1, min(8, n // _FLOAT32_TILE_ROWS))
    edges = [round(k * n / tiles) for k in range(tiles + 1)]
    for start in range(0, A.shape[1], _FLOAT32_COLUMNS):
        a = A[:, start:start + _FLOAT32_COLUMNS].to(torch.float32)
        if B is not None:
            out += torch.mm(a, B[:, start:start + _FLOAT32_COLUMNS].to(device=A.device, dtype=torch.float32).T)
            continue
        for lo, hi in zip(edges, edges[1:]):
            out[lo:hi, lo:] += torch.mm(a[lo:hi], a[lo:].T)
    if B is None:
        for lo, hi in zip(edges, edges[1:]):  # mirror the upper tiles (the diagonal tiles are whole)
            out[hi:, lo:hi] = out[lo:hi, hi:].T
    return out


def check_precision(precision) -> None:
    """Raise ValueError unless ``precision`` is one of :data:`PRECISIONS`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")


# ---------------------------------------------------------------------------
# Sketching


class CountSketch:
    """A fixed random CountSketch ``R^d -> R^k``: coordinate j goes to bucket ``h(j)`` with sign ``s(j)``.

    ``sketch(x)^T sketch(y)`` is an unbiased estimate of ``x^T y``. The hash and signs
    are drawn once from ``seed``; applying the sketch costs ``O(n d)``.
    """

    def __init__(self, d: int, k: int, seed: int = 0):
        check_sketch_dim(k, d)
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
        step = column_block(rows.shape[0])
        for start in range(0, self.d, step):
            block = rows[:, start:start + step].to(torch.float64) * sign[start:start + step]
            if scale != 1.0:
                block = block * scale
            out.index_add_(1, bucket[start:start + step], block)
        return out
