"""Exact alignment moments, effective dimensions and the two misalignment certificates.

Notation (the paper's): q is the activation gradient at the insertion point, with
population mean ``mu`` (shape ``(d,)``) and covariance ``sigma`` (shape ``(d, d)``).
``mu_M`` is a train mean over M examples and ``g_K`` an independent test mean over K.

* ``E[mu_M^T g_K]   = ||mu||^2``
* ``Var(mu_M^T g_K) = (1/M + 1/K) mu^T Sigma mu + tr(Sigma^2) / (M K)``
* ``d_par = ||mu||^4 / mu^T Sigma mu``,  ``d_2 = ||mu||^4 / tr(Sigma^2)``,
  ``d_align = min(d_par, d_2)``
* ``n_eff = M K / (M + K + 1)``
* ``B_exact = Var / (Var + ||mu||^4)`` (Cantelli) ``<= B_align = 1 / (1 + n_eff d_align)``

Conventions for degenerate geometry, chosen so that the certificates stay valid:
``mu = 0`` gives ``d_par = d_2 = d_align = 0`` and both bounds 1 (nothing is certified);
``mu != 0`` with ``mu^T Sigma mu = 0`` (or ``tr(Sigma^2) = 0``) gives an infinite
dimension, and with no noise at all both bounds are 0.

Every function accepts numpy arrays or torch tensors on any device, computes in
float64 and returns Python floats (:func:`n_eff` and :func:`b_align` also take
arrays elementwise and then return numpy arrays). ``sigma`` must be symmetric and
positive semidefinite (within rounding): anything else is refused with a ValueError.  The functions ending in ``_from_moments`` take
the three scalar moments directly; the estimators use them, so one formula serves
both the population and the estimated geometry.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from dalign_core._tensor import as_count, as_float64

__all__ = [
    "EffectiveDims",
    "n_eff",
    "alignment_mean",
    "alignment_variance",
    "effective_dims",
    "b_exact",
    "b_align",
    "dims_from_moments",
    "dims_tensor",
    "variance_from_moments",
    "b_exact_from_moments",
]


@dataclass(frozen=True)
class EffectiveDims:
    """The paper's effective dimensions (dimensionless, >= 0, possibly ``inf``)."""

    d_par: float
    """Directional dimension ``||mu||^4 / mu^T Sigma mu``."""
    d_2: float
    """Covariance-energy dimension ``||mu||^4 / tr(Sigma^2)``."""
    d_align: float
    """Effective alignment dimension ``min(d_par, d_2)``."""


def n_eff(M, K):
    """Effective sample size ``M K / (M + K + 1)`` for train budget M and test budget K (both >= 1).

    Scalars give a float; arrays (numpy broadcasting) give a float64 numpy array.
    """
    M, K = _budget(M, "M"), _budget(K, "K")
    with np.errstate(over="ignore", invalid="ignore"):
        product = M * K
        # M K overflows beyond ~1e154 each: then 1 / (1/M + 1/K + 1/(M K)), the same number without overflow
        n = product / (M + K + 1.0)
        if np.all(np.isfinite(product)):
            return n
        safe = 1.0 / (1.0 / M + 1.0 / K + 1.0 / M / K)
        return safe if np.ndim(n) == 0 else np.where(np.isfinite(product), n, safe)


def _is_scalar(x) -> bool:
    return np.ndim(x.detach().cpu() if isinstance(x, torch.Tensor) else x) == 0


def _as_numpy(x, name: str) -> np.ndarray:
    """``x`` (array, tensor, nested sequence) as a float64 numpy array, or ValueError naming ``name``.

    Complex numbers (whose imaginary part would be dropped) and strings (which numpy would parse) are refused.
    """
    _refuse_complex(x, name)
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    raw = x if isinstance(x, np.ndarray) else None
    try:
        if raw is None:
            raw = np.asarray(x)
        if raw.dtype.kind in "USVMm" or raw.dtype.kind == "O" and not all(
                isinstance(v, numbers.Number) for v in raw.flat):
            raise TypeError("only numbers are numbers (numpy would parse strings and take None for nan)")
        with np.errstate(over="ignore"):
            return np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a number or an array of numbers, got {type(x).__name__}"
                         + (f" of dtype {raw.dtype}" if isinstance(raw, np.ndarray) else "")) from err


def _refuse_complex(x, name: str) -> None:
    """Raise TypeError if ``x`` (number, array, tensor, nested sequence) holds complex numbers."""
    if isinstance(x, torch.Tensor):
        complex_ = x.is_complex()
    elif isinstance(x, np.ndarray):
        complex_ = x.dtype.kind == "c" or x.dtype.kind == "O" and any(_is_complex(v) for v in x.flat)
    elif isinstance(x, (list, tuple)):
        complex_ = any(_is_complex(v) for v in _flatten(x))
    else:
        complex_ = _is_complex(x)
    if complex_:
        raise TypeError(f"{name} is complex; the bounds are defined for real vectors and the imaginary part would "
                        f"be lost. Pass {name}.real if that is what you mean")


def _is_complex(value) -> bool:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return bool(value.is_complex()) if isinstance(value, torch.Tensor) else value.dtype.kind == "c"
    return isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real)


def _flatten(items):
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from _flatten(item)
        else:
            yield item


def _budget(x, name: str):
    """A sample budget: a float for a scalar (see :func:`as_count`), else a validated float64 array."""
    if _is_scalar(x):
        return as_count(x.item() if isinstance(x, (torch.Tensor, np.ndarray)) else x, name)
    values = _as_numpy(x, name)
    if not np.isfinite(values).all():
        raise ValueError(f"{name} must be finite, got {values[~np.isfinite(values)][0]} among its entries")
    if (values < 1).any():
        raise ValueError(f"{name} is a number of examples and must be at least 1, got {values.min()} among its entries")
    return values


def _check_mu(mu) -> torch.Tensor:
    _refuse_complex(mu, "mu")
    mu = as_float64(mu, "mu")
    if mu.ndim != 1:
        raise ValueError(f"mu must be a vector of shape (d,), got shape {tuple(mu.shape)}")
    return mu


def _check_sigma(sigma, d: int, device: torch.device) -> torch.Tensor:
    _refuse_complex(sigma, "sigma")
    sigma = as_float64(sigma, "sigma").to(device)
    if sigma.shape != (d, d):
        raise ValueError(f"sigma must have shape (d, d) = ({d}, {d}) to match mu, got {tuple(sigma.shape)}")
    scale = float(sigma.abs().max()) if sigma.numel() else 0.0
    asym = float((sigma - sigma.T).abs().max()) if sigma.numel() else 0.0
    if asym > 1e-8 * max(scale, 1e-300):
        raise ValueError(
            f"sigma must be symmetric (a covariance matrix); max |sigma - sigma^T| = {asym:.3g} "
            f"against max |sigma| = {scale:.3g}. Symmetrize it with (sigma + sigma.T) / 2 if the asymmetry is rounding."
        )
    _check_psd(sigma, scale)
    return sigma


PSD_RTOL = 1e-6
"""Eigenvalues of sigma down to ``-PSD_RTOL * max|sigma|`` count as rounding (a float32 covariance has such)."""
_EIGEN_MAX_DIM = 1024
"""Up to this d, PSD is checked by eigenvalues (and the message names the smallest); above, by Cholesky."""


def _check_psd(sigma: torch.Tensor, scale: float) -> None:
    """Raise ValueError unless the symmetric ``sigma`` is positive semidefinite within :data:`PSD_RTOL`."""
    if not sigma.numel() or scale == 0.0:
        return
    tolerance = PSD_RTOL * scale
    diagonal = torch.diagonal(sigma)
    lowest_variance = float(diagonal.min())
    if lowest_variance < -tolerance:
        index = int(diagonal.argmin())
        raise ValueError(
            f"sigma is not a covariance matrix: its diagonal holds the negative variance sigma[{index}, {index}] = "
            f"{lowest_variance:.3g}; pass the covariance of q (positive semidefinite), e.g. a sample covariance"
        )
    if sigma.shape[0] <= _EIGEN_MAX_DIM:
        lowest = float(torch.linalg.eigvalsh(sigma)[0])
        if lowest < -tolerance:
            raise ValueError(
                f"sigma is not positive semidefinite: its smallest eigenvalue is {lowest:.3g} against max |sigma| = "
                f"{scale:.3g}, so some direction would have negative variance; pass the covariance of q (e.g. a "
                "sample covariance), or clip its eigenvalues at 0 if the negative ones come from an approximation"
            )
        return
    jittered = sigma + tolerance * torch.eye(sigma.shape[0], dtype=sigma.dtype, device=sigma.device)
    if int(torch.linalg.cholesky_ex(jittered).info) != 0:
        raise ValueError(
            f"sigma is not positive semidefinite: a Cholesky factorization fails even after adding {tolerance:.3g} "
            "to the diagonal, so some direction has negative variance; pass the covariance of q (e.g. a sample "
            "covariance), or clip its eigenvalues at 0 if the negative ones come from an approximation"
        )


def _moments(mu, sigma) -> tuple[float, float, float]:
    """Return (||mu||^2, mu^T Sigma mu, tr(Sigma^2)) in float64."""
    mu = _check_mu(mu)
    sigma = _check_sigma(sigma, mu.shape[0], mu.device)
    mean_sq = float(mu @ mu)
    directional = float(mu @ (sigma @ mu))
    cov_energy = float((sigma * sigma).sum())  # tr(Sigma^2) = ||Sigma||_F^2 for symmetric Sigma
    return mean_sq, directional, cov_energy


def dims_tensor(mean_sq_sq: torch.Tensor, directional: torch.Tensor, cov_energy: torch.Tensor):
    """Elementwise ``(d_par, d_2, d_align)`` for tensors of moments (any matching shapes).

    Negative inputs (which unbiased estimates can produce on small samples) are
    treated as zero: a non-positive ``||mu||^4`` means no detectable mean
    direction (dimension 0); a zero noise term with a signal gives ``inf``.
    """
    signal = mean_sq_sq.clamp(min=0.0)

    def ratio(noise: torch.Tensor) -> torch.Tensor:
        noise = noise.clamp(min=0.0)
        out = signal / torch.where(noise > 0, noise, torch.ones_like(noise))
        out = torch.where(noise > 0, out, torch.full_like(out, math.inf))
        return torch.where(signal > 0, out, torch.zeros_like(out))

    d_par, d_2 = ratio(directional), ratio(cov_energy)
    return d_par, d_2, torch.minimum(d_par, d_2)


def dims_from_moments(mean_sq_sq: float, directional: float, cov_energy: float) -> EffectiveDims:
    """Effective dimensions from ``||mu||^4``, ``mu^T Sigma mu`` and ``tr(Sigma^2)`` (see :func:`dims_tensor`)."""
    moments = (torch.tensor(float(v), dtype=torch.float64) for v in (mean_sq_sq, directional, cov_energy))
    d_par, d_2, d_align = dims_tensor(*moments)
    return EffectiveDims(d_par=float(d_par), d_2=float(d_2), d_align=float(d_align))


def variance_from_moments(directional: float, cov_energy: float, M, K) -> float:
    """``Var(mu_M^T g_K) = (1/M + 1/K) mu^T Sigma mu + tr(Sigma^2)/(M K)``."""
    M, K = as_count(M, "M"), as_count(K, "K")
    return (1.0 / M + 1.0 / K) * float(directional) + float(cov_energy) / (M * K)


def b_exact_from_moments(mean_sq_sq: float, directional: float, cov_energy: float, M, K) -> float:
    """Cantelli certificate ``Var / (Var + ||mu||^4)`` from the scalar moments (1 when ``mu = 0``)."""
    variance = max(variance_from_moments(max(directional, 0.0), max(cov_energy, 0.0), M, K), 0.0)
    signal = max(float(mean_sq_sq), 0.0)
    if signal == 0.0:
        return 1.0
    return variance / (variance + signal)


def alignment_mean(mu) -> float:
    """``E[mu_M^T g_K] = ||mu||^2`` for mu of shape ``(d,)``."""
    mu = _check_mu(mu)
    return float(mu @ mu)


def alignment_variance(mu, sigma, M, K) -> float:
    """Exact ``Var(mu_M^T g_K)`` for mu ``(d,)``, symmetric sigma ``(d, d)`` and budgets M, K >= 1."""
    _, directional, cov_energy = _moments(mu, sigma)
    return variance_from_moments(directional, cov_energy, M, K)


def effective_dims(mu, sigma) -> EffectiveDims:
    """``d_par``, ``d_2`` and ``d_align`` of the geometry (mu ``(d,)``, sigma ``(d, d)``)."""
    mean_sq, directional, cov_energy = _moments(mu, sigma)
    return dims_from_moments(mean_sq * mean_sq, directional, cov_energy)


def b_exact(mu, sigma, M, K) -> float:
    """Cantelli's bound on ``Pr(mu_M^T g_K <= 0)`` with the exact variance; 1 when ``mu = 0``."""
    mean_sq, directional, cov_energy = _moments(mu, sigma)
    return b_exact_from_moments(mean_sq * mean_sq, directional, cov_energy, M, K)


def b_align(d_align, M, K):
    """Theorem 1's one-scalar bound ``1 / (1 + n_eff(M, K) d_align)``.

    ``d_align`` must be >= 0 (``inf`` gives 0); M and K are the sample budgets. Scalars
    give a float; arrays (numpy arrays, tensors, lists) are taken elementwise with
    numpy broadcasting and give a float64 numpy array, e.g. B_align along a grid of
    ``d_align`` for a plot.
    """
    scalar = _is_scalar(d_align) and _is_scalar(M) and _is_scalar(K)
    dims = _as_numpy(d_align, "d_align")
    bad = np.isnan(dims) | (dims < 0)
    if bad.any():
        where = "" if dims.ndim == 0 else f" at index {tuple(int(i) for i in np.argwhere(bad)[0])}"
        raise ValueError(f"d_align must be a non-negative number, got {dims[bad].flat[0]}{where}")
    n = n_eff(M, K)
    with np.errstate(over="ignore"):
        bound = 1.0 / (1.0 + n * dims)  # d_align = inf gives 0
    return float(bound) if scalar else bound
