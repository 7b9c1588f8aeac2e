"""The streamed estimate: q rows fed batch by batch as they come off backward passes, one Gram matrix grown.

:class:`GeometryAccumulator` keeps the rows it has seen (or their CountSketches) and the
growing Gram matrix, so its result equals :func:`dalign_core.geometry.estimators.estimate_geometry`
on all rows stacked (to float rounding); the capture pass feeds it one batch at a time.
"""

from __future__ import annotations

import math

import torch

from dalign_core.geometry.rows import (
    FLOAT32_MIN_WORK,
    CountSketch,
    check_precision,
    check_sketch_dim,
    checked_rows,
    column_block,
    scale_exponent,
    times_pow2_,
    float32_gram,
    float32_mean_ratio_allows,
    float32_products_allowed,
    gram_product,
)
from dalign_core.geometry.ustatistics import Geometry, check_n, geometry_from_scaled_gram

__all__ = ["GeometryAccumulator"]


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
        precision: ``"auto"`` (default) multiplies float32 rows in float32 (summed in float64) once the Gram
            matrix reaches ``n^2 d >= 2^30``, as :func:`~dalign_core.geometry.estimators.estimate_geometry`
            does; if at :meth:`result` the rows' mean is too large against their noise for that
            (:func:`~dalign_core.geometry.rows.float32_mean_ratio_allows`), the Gram matrix is formed again
            from the kept rows in float64, and later batches are multiplied in float64. ``"float64"``: always
            float64 products.
    """

    def __init__(self, *, sketch_dim: int | None = None, seed: int = 0, device=None, dtype: torch.dtype | None = None,
                 precision: str = "auto"):
        check_sketch_dim(sketch_dim)
        check_precision(precision)
        self.precision = precision
        self._float64_only = precision == "float64"
        self._float32_entries = False  # whether some Gram entries came from float32 products
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
        exponent = scale_exponent(self._peak)
        if exponent != self._exponent and self.n:
            shift = exponent - self._exponent
            times_pow2_(self._rows[: self.n], -shift)
            times_pow2_(self._gram[: self.n, : self.n], -2 * shift)
        self._exponent = exponent

    def update(self, rows) -> "GeometryAccumulator":
        """Add a batch of rows of shape ``(b, d)``; returns ``self``."""
        batch, peak = checked_rows(rows, "rows")
        if self.d is None:
            check_sketch_dim(self.sketch_dim, batch.shape[1])
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
            step = column_block(b)
            for column in range(0, self.d, step):
                kept[:, column:column + step] = batch[:, column:column + step].to(torch.float64) * scale
        if self._use_float32(start + b):
            cross = float32_gram(kept, self._rows[:start]) if start else None
            block = float32_gram(kept)
            self._float32_entries = True
        else:
            cross = gram_product(kept, self._rows[:start]) if start else None
            block = gram_product(kept, kept)
        self._gram[start:start + b, start:start + b] = block
        if cross is not None:
            self._gram[start:start + b, :start] = cross
            self._gram[:start, start:start + b] = cross.T
        self.n = start + b
        return self

    def _use_float32(self, n: int) -> bool:
        """Whether the next batch's products (the Gram of ``n`` rows once it is added) may be float32 products."""
        return (not self._float64_only and self._sketch is None and self._exponent == 0
                and n * n * self.d >= FLOAT32_MIN_WORK
                and float32_products_allowed(self.dtype, self._peak, self.device))

    def _settle(self) -> None:
        """Form the Gram matrix again in float64 where float32 products are not accurate enough for these rows."""
        if not self._float32_entries or float32_mean_ratio_allows(self._gram[: self.n, : self.n]):
            return
        rows = self._rows[: self.n]
        self._gram[: self.n, : self.n] = gram_product(rows, rows)
        self._float32_entries, self._float64_only = False, True

    def gram(self) -> torch.Tensor:
        """The ``(n, n)`` float64 Gram matrix of the rows seen so far (of their sketches, if sketching)."""
        if self._gram is None:
            return torch.zeros(0, 0, dtype=torch.float64)
        self._settle()
        gram = self._gram[: self.n, : self.n]
        return times_pow2_(gram.clone(), 2 * self._exponent) if self._exponent else gram

    def rows(self) -> torch.Tensor:
        """The kept rows, shape ``(n, d)`` (or ``(n, k)`` sketches)."""
        if self._rows is None:
            return torch.zeros(0, 0)
        rows = self._rows[: self.n]
        return times_pow2_(rows.to(torch.float64), self._exponent) if self._exponent else rows

    def result(self, confidence: float = 0.95) -> Geometry:
        """The estimated :class:`Geometry` with jackknife intervals at level ``confidence``."""
        check_n(self.n)
        self._settle()
        return geometry_from_scaled_gram(self._gram[: self.n, : self.n], 2 * self._exponent, self.d,
                                          confidence=confidence, sketch_dim=self.sketch_dim)


def _kept_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 rows are kept in float64, any other floating rows in float32 (float16 would overflow)."""
    return torch.float64 if dtype == torch.float64 else torch.float32
