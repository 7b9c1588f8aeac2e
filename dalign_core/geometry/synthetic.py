"""Synthetic activation gradients with a known mean and covariance, for checking the theory.

``q = mu + U diag(sqrt(lambda)) z`` where ``z`` has independent coordinates of mean
0 and variance 1, drawn from one of three laws: ``gaussian``, ``student_t`` (5
degrees of freedom, rescaled: heavy tails, finite variance) and ``rademacher``
(+-1: discrete). The paper's moment formulas need only second moments, so they
must hold for all three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["NOISE_LAWS", "SPECTRA", "SyntheticQ", "spectrum", "mean_norm_for_snr"]

NOISE_LAWS = ("gaussian", "student_t", "rademacher")
SPECTRA = ("flat", "power", "spiked")
_T_DOF = 5.0


def spectrum(kind: str, d: int) -> np.ndarray:
    """Covariance eigenvalues of shape ``(d,)``, normalized to ``tr(Sigma) = d``.

    ``flat``: all equal; ``power``: ``lambda_j ~ 1/j``; ``spiked``: one eigenvalue
    holding half the trace, the rest equal.
    """
    if kind == "flat":
        values = np.ones(d)
    elif kind == "power":
        values = 1.0 / np.arange(1, d + 1)
    elif kind == "spiked":
        values = np.full(d, 1.0 if d == 1 else 0.5 / (d - 1))
        values[0] = 0.5 if d > 1 else 1.0
    else:
        raise ValueError(f"unknown spectrum {kind!r}; choose one of {SPECTRA}")
    return values * d / values.sum()


def mean_norm_for_snr(snr: float, direction_var: float, cov_energy: float, M: int, K: int) -> float:
    """The ``||mu||`` that gives ``E[mu_M^T g_K] / sd(mu_M^T g_K) = snr`` along a unit direction u.

    ``direction_var = u^T Sigma u``. Solves ``s^4 = snr^2 ((1/M + 1/K) a s^2 + c/(MK))`` for ``s^2``.
    """
    alpha = 1.0 / M + 1.0 / K
    a, c, r2 = direction_var, cov_energy, snr * snr
    s2 = 0.5 * (r2 * alpha * a + math.sqrt((r2 * alpha * a) ** 2 + 4.0 * r2 * c / (M * K)))
    return math.sqrt(s2)


@dataclass
class SyntheticQ:
    """A law for q with mean ``mu`` ``(d,)`` and covariance ``basis diag(eigenvalues) basis^T``."""

    mu: np.ndarray
    eigenvalues: np.ndarray
    basis: np.ndarray
    noise: str = "gaussian"

    def __post_init__(self):
        if self.noise not in NOISE_LAWS:
            raise ValueError(f"unknown noise law {self.noise!r}; choose one of {NOISE_LAWS}")

    @classmethod
    def random(
        cls, d: int, spectrum_kind: str, noise: str, mean_norm: float, rng: np.random.Generator, rotate: bool = True
    ):
        """A random mean direction (so mu is not an eigenvector) and, if ``rotate``, a random orthogonal basis.

        Every quantity of the theory and every Gram-based estimate is invariant under
        rotation, so ``rotate=False`` (axis-aligned covariance) is exact and much cheaper at large d.
        """
        basis = np.linalg.qr(rng.normal(size=(d, d)))[0] if rotate else np.eye(d)
        direction = rng.normal(size=d)
        direction /= np.linalg.norm(direction)
        return cls(mu=mean_norm * direction, eigenvalues=spectrum(spectrum_kind, d), basis=basis, noise=noise)

    @property
    def d(self) -> int:
        return self.mu.shape[0]

    @property
    def directional(self) -> float:
        """``mu^T Sigma mu``."""
        return float(self.eigenvalues @ (self.basis.T @ self.mu) ** 2)

    @property
    def cov_energy(self) -> float:
        """``tr(Sigma^2)``."""
        return float(self.eigenvalues @ self.eigenvalues)

    @property
    def sigma(self) -> np.ndarray:
        """The covariance, shape ``(d, d)``."""
        return (self.basis * self.eigenvalues) @ self.basis.T

    def _standard_means(self, count: int, size: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` means of ``size`` iid standardized z vectors, shape ``(count, d)``."""
        d = self.d
        if self.noise == "gaussian":  # the mean of Gaussians is Gaussian: draw it directly
            return rng.standard_normal((count, d)) / math.sqrt(size)
        if self.noise == "rademacher":  # a sum of +-1 signs is 2 Binomial(size, 1/2) - size
            return (2.0 * rng.binomial(size, 0.5, (count, d)) - size) / size
        scale = math.sqrt((_T_DOF - 2.0) / _T_DOF)
        total = np.zeros((count, d))
        for _ in range(size):
            total += rng.standard_t(_T_DOF, (count, d))
        return total * (scale / size)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` iid draws of q, shape ``(n, d)``."""
        return self.sample_means(n, 1, rng)

    def sample_means(self, count: int, size: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` independent means of ``size`` iid draws of q, shape ``(count, d)``."""
        z = self._standard_means(count, size, rng) * np.sqrt(self.eigenvalues)
        return self.mu + (z if self._axis_aligned else z @ self.basis.T)

    @property
    def _axis_aligned(self) -> bool:
        return bool(np.array_equal(self.basis, np.eye(self.d)))
