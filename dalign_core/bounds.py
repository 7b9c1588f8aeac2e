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
float64 and returns Python floats.  The functions ending in ``_from_moments`` take
the three scalar moments directly; the estimators use them, so one formula serves
both the population and the estimated geometry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def n_eff(M, K) -> float:
    """Effective sample size ``M K / (M + K + 1)`` for train budget M and test budget K (both >= 1)."""
    M, K = as_count(M, "M"), as_count(K, "K")
    return M * K / (M + K + 1.0)


def _check_mu(mu) -> torch.Tensor:
    mu = as_float64(mu, "mu")
    if mu.ndim != 1:
        raise ValueError(f"mu must be a vector of shape (d,), got shape {tuple(mu.shape)}")
    return mu


def _check_sigma(sigma, d: int, device: torch.device) -> torch.Tensor:
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
    return sigma


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


def b_align(d_align, M, K) -> float:
    """Theorem 1's one-scalar bound ``1 / (1 + n_eff(M, K) d_align)``.

    ``d_align`` must be >= 0 (``inf`` gives 0); M and K are the sample budgets.
    """
    if isinstance(d_align, torch.Tensor):
        d_align = d_align.item()
    d_align = float(d_align)
    if math.isnan(d_align) or d_align < 0:
        raise ValueError(f"d_align must be a non-negative number, got {d_align}")
    n = n_eff(M, K)
    if math.isinf(d_align):
        return 0.0
    return 1.0 / (1.0 + n * d_align)
