"""Each formula of dalign_core.geometry.bounds against brute-force numpy, plus the documented edge cases."""

import math
import warnings

import numpy as np
import pytest
import torch

from dalign_core.geometry import bounds


def random_geometry(rng, d):
    mu = rng.normal(size=d) * rng.uniform(0.1, 2.0)
    A = rng.normal(size=(d, d)) / math.sqrt(d)
    sigma = A @ A.T
    return mu, sigma


@pytest.mark.parametrize("seed", range(20))
def test_formulas_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 40))
    M, K = int(rng.integers(1, 200)), int(rng.integers(1, 200))
    mu, sigma = random_geometry(rng, d)

    mean = mu @ mu
    directional = mu @ sigma @ mu
    cov_energy = np.trace(sigma @ sigma)
    var = (1 / M + 1 / K) * directional + cov_energy / (M * K)
    d_par, d_2 = mean**2 / directional, mean**2 / cov_energy
    n_eff = M * K / (M + K + 1)

    assert bounds.n_eff(M, K) == pytest.approx(n_eff, rel=1e-12)
    assert bounds.alignment_mean(mu) == pytest.approx(mean, rel=1e-12)
    assert bounds.alignment_variance(mu, sigma, M, K) == pytest.approx(var, rel=1e-10)
    dims = bounds.effective_dims(mu, sigma)
    assert dims.d_par == pytest.approx(d_par, rel=1e-10)
    assert dims.d_2 == pytest.approx(d_2, rel=1e-10)
    assert dims.d_align == pytest.approx(min(d_par, d_2), rel=1e-10)
    assert bounds.b_exact(mu, sigma, M, K) == pytest.approx(var / (var + mean**2), rel=1e-10)
    assert bounds.b_align(dims.d_align, M, K) == pytest.approx(1 / (1 + n_eff * min(d_par, d_2)), rel=1e-10)


@pytest.mark.parametrize("seed", range(50))
def test_b_exact_never_exceeds_b_align(seed):
    rng = np.random.default_rng(1000 + seed)
    d = int(rng.integers(1, 30))
    mu, sigma = random_geometry(rng, d)
    # Also low-rank covariances, where one of the two dimensions dominates.
    if seed % 3 == 0:
        v = rng.normal(size=(d, 1))
        sigma = v @ v.T
    M, K = int(rng.integers(1, 500)), int(rng.integers(1, 500))
    exact = bounds.b_exact(mu, sigma, M, K)
    align = bounds.b_align(bounds.effective_dims(mu, sigma).d_align, M, K)
    assert 0.0 <= exact <= align + 1e-12 <= 1.0 + 1e-12


def test_alignment_moments_match_monte_carlo():
    """The exact mean and variance hold for a simulated Gaussian q (a sanity check of the algebra)."""
    rng = np.random.default_rng(7)
    d, M, K, trials = 5, 3, 4, 200_000
    mu, sigma = random_geometry(rng, d)
    L = np.linalg.cholesky(sigma + 1e-12 * np.eye(d))
    mu_M = mu + rng.normal(size=(trials, d)) @ L.T / math.sqrt(M)
    g_K = mu + rng.normal(size=(trials, d)) @ L.T / math.sqrt(K)
    stat = (mu_M * g_K).sum(axis=1)
    se_mean = stat.std() / math.sqrt(trials)
    assert abs(stat.mean() - bounds.alignment_mean(mu)) < 4 * se_mean
    assert stat.var() == pytest.approx(bounds.alignment_variance(mu, sigma, M, K), rel=0.02)


def test_torch_inputs_match_numpy():
    rng = np.random.default_rng(3)
    mu, sigma = random_geometry(rng, 6)
    for convert in (torch.tensor, lambda a: torch.tensor(a, dtype=torch.float32)):
        mu_t, sigma_t = convert(mu), convert(sigma)
        sigma_t = (sigma_t + sigma_t.T) / 2
        got = bounds.b_exact(mu_t, sigma_t, 5, 7)
        assert isinstance(got, float)
        assert got == pytest.approx(bounds.b_exact(mu, sigma, 5, 7), rel=1e-5)
    assert isinstance(bounds.alignment_variance(torch.tensor(mu), torch.tensor(sigma), 2, 3), float)


def test_zero_mean_gives_zero_dims_and_trivial_bounds_quietly():
    d = 4
    mu, sigma = np.zeros(d), np.eye(d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dims = bounds.effective_dims(mu, sigma)
        assert (dims.d_par, dims.d_2, dims.d_align) == (0.0, 0.0, 0.0)
        assert bounds.b_exact(mu, sigma, 3, 3) == 1.0
        assert bounds.b_align(dims.d_align, 3, 3) == 1.0
        # Zero covariance too: still nothing certified.
        assert bounds.b_exact(mu, np.zeros((d, d)), 3, 3) == 1.0


def test_noiseless_nonzero_mean_is_certain():
    mu, sigma = np.ones(3), np.zeros((3, 3))
    dims = bounds.effective_dims(mu, sigma)
    assert math.isinf(dims.d_align)
    assert bounds.b_exact(mu, sigma, 2, 2) == 0.0
    assert bounds.b_align(dims.d_align, 2, 2) == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_names_the_argument(bad):
    mu, sigma = np.ones(3), np.eye(3)
    mu_bad = mu.copy()
    mu_bad[1] = bad
    with pytest.raises(ValueError, match=r"mu contains 1 non-finite.*index \(1,\)"):
        bounds.b_exact(mu_bad, sigma, 2, 2)
    sigma_bad = sigma.copy()
    sigma_bad[2, 0] = bad
    with pytest.raises(ValueError, match=r"sigma contains 1 non-finite.*index \(2, 0\)"):
        bounds.alignment_variance(mu, sigma_bad, 2, 2)
    with pytest.raises(ValueError, match="M must be finite|d_align must be"):
        bounds.n_eff(bad, 2) if not np.isnan(bad) else bounds.b_align(bad, 2, 2)


@pytest.mark.parametrize("M,K", [(0, 5), (5, 0), (0.5, 2), (-1, 3)])
def test_budgets_below_one_are_rejected(M, K):
    with pytest.raises(ValueError, match="at least 1"):
        bounds.n_eff(M, K)
    with pytest.raises(ValueError, match="at least 1"):
        bounds.alignment_variance(np.ones(2), np.eye(2), M, K)


def test_bad_sigma_shape_or_asymmetry():
    mu = np.ones(3)
    with pytest.raises(ValueError, match=r"shape \(d, d\) = \(3, 3\)"):
        bounds.b_exact(mu, np.eye(4), 2, 2)
    with pytest.raises(ValueError, match="symmetric"):
        bounds.effective_dims(mu, np.array([[1.0, 0.5, 0], [0, 1, 0], [0, 0, 1]]))
    with pytest.raises(ValueError, match=r"mu must be a vector"):
        bounds.alignment_mean(np.ones((2, 2)))
    with pytest.raises(ValueError, match="non-negative"):
        bounds.b_align(-0.1, 2, 2)


@pytest.mark.parametrize("sigma,match", [
    (-np.eye(3), r"negative variance sigma\[0, 0\] = -1"),
    (np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), r"not positive semidefinite.*smallest eigenvalue is -1"),
])
def test_sigma_that_is_not_a_covariance_is_refused(sigma, match):
    mu = np.ones(3)
    for call in (lambda: bounds.b_exact(mu, sigma, 16, 16), lambda: bounds.alignment_variance(mu, sigma, 16, 16),
                 lambda: bounds.effective_dims(mu, sigma)):
        with pytest.raises(ValueError, match=match):
            call()


def test_psd_check_by_cholesky_for_large_d_and_rounding_is_accepted(monkeypatch):
    rng = np.random.default_rng(0)
    # a float32 sample covariance of 5 points in 60 dimensions: rank 4, eigenvalues negative only by rounding
    sample = rng.normal(size=(5, 60)).astype(np.float32)
    rounded = np.cov(sample.T).astype(np.float32)
    assert np.linalg.eigvalsh(rounded.astype(np.float64))[0] < 0
    bounds.effective_dims(np.ones(60), rounded)
    monkeypatch.setattr(bounds, "_EIGEN_MAX_DIM", 4)  # the Cholesky path, used above 1024 dimensions
    bounds.effective_dims(np.ones(60), rounded)
    indefinite = np.eye(6)
    indefinite[0, 1] = indefinite[1, 0] = 3.0
    with pytest.raises(ValueError, match="Cholesky factorization fails"):
        bounds.b_exact(np.ones(6), indefinite, 2, 2)


def test_b_align_takes_arrays_elementwise_and_scalars_as_floats():
    dims = np.array([0.0, 0.5, 2.0, np.inf])
    out = bounds.b_align(dims, 10, 20)
    assert isinstance(out, np.ndarray) and out.shape == (4,)
    np.testing.assert_allclose(out, [bounds.b_align(float(d), 10, 20) for d in dims])
    assert out[0] == 1.0 and out[-1] == 0.0
    assert isinstance(bounds.b_align(0.5, 10, 20), float)
    assert isinstance(bounds.b_align(torch.tensor(0.5), 10, 20), float)
    np.testing.assert_allclose(bounds.b_align(torch.tensor([0.5, 2.0]), 10, 20), out[1:3])
    np.testing.assert_allclose(bounds.b_align([0.5, 2.0], 10, 20), out[1:3])
    # budgets broadcast too: a (3, 1) grid of d_align against a (2,) row of M
    grid = bounds.b_align(np.array([[0.5], [1.0], [2.0]]), np.array([10, 100]), 20)
    assert grid.shape == (3, 2)
    assert grid[2, 1] == pytest.approx(bounds.b_align(2.0, 100, 20))
    np.testing.assert_allclose(bounds.n_eff(np.array([10, 100]), 20), [bounds.n_eff(10, 20), bounds.n_eff(100, 20)])
    with pytest.raises(ValueError, match=r"d_align must be a non-negative number, got -1.0 at index \(2,\)"):
        bounds.b_align(np.array([1.0, 2.0, -1.0]), 10, 20)
    with pytest.raises(ValueError, match="M is a number of examples and must be at least 1"):
        bounds.b_align(dims, np.array([10, 0.5]).reshape(2, 1), 20)


# ---------------------------------------------------------------------------
# Extreme budgets and inputs that are not real numbers


@pytest.mark.parametrize("M,K", [(1e308, 1e308), (1.0, 1e308), (1e200, 1e300), (1e154, 1e155)])
def test_n_eff_and_b_align_do_not_overflow(M, K):
    n = bounds.n_eff(M, K)
    assert math.isfinite(n) and n > 0
    exact = 1.0 / (1.0 / M + 1.0 / K + 1.0 / M / K)  # the same number, computed without M K
    assert n == pytest.approx(exact, rel=1e-12)
    b = bounds.b_align(1.0, M, K)
    assert math.isfinite(b) and b == pytest.approx(1.0 / (1.0 + exact), rel=1e-12)
    assert bounds.b_align(1, 1e308, 1e308) == pytest.approx(2e-308, rel=1e-12)


def test_n_eff_arrays_mix_ordinary_and_huge_budgets():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warnings either
        n = bounds.n_eff(np.array([1.0, 3.0, 1e308]), np.array([1.0, 5.0, 1e308]))
    assert n[0] == 1.0 / 3.0 and n[1] == 15.0 / 9.0 and n[2] == pytest.approx(5e307, rel=1e-12)
    assert bounds.n_eff(3, 5) == 15.0 / 9.0  # the ordinary formula, unchanged bit for bit


@pytest.mark.parametrize("bad", [1 + 2j, np.array([1.0 + 0.5j]), torch.tensor([1j]), [1.0, 2j], np.complex128(3)])
def test_complex_d_align_is_refused(bad):
    with pytest.raises(TypeError, match="d_align is complex.*imaginary part would be lost"):
        bounds.b_align(bad, 3, 3)


def test_complex_mu_or_sigma_is_refused():
    with pytest.raises(TypeError, match="mu is complex"):
        bounds.effective_dims(np.array([1.0 + 1j, 2.0]), np.eye(2))
    with pytest.raises(TypeError, match="sigma is complex"):
        bounds.b_exact(np.ones(2), np.eye(2) * (1 + 0j), 3, 3)


@pytest.mark.parametrize("bad", ["3", np.array(["1", "2"]), np.array([1.0, "a"], dtype=object), [None]])
def test_strings_and_other_non_numbers_are_refused(bad):
    with pytest.raises(ValueError, match="d_align must be a number or an array of numbers"):
        bounds.b_align(bad, 3, 3)


def test_unusual_numeric_arrays_work():
    want = bounds.b_align(np.array([2.0, 1.0, 0.0]), 3, 3)
    assert np.array_equal(bounds.b_align(np.arange(3.0)[::-1], 3, 3), want)  # negative stride
    assert np.array_equal(bounds.b_align(np.array([2, 1, 0], dtype=object), 3, 3), want)
    assert np.array_equal(bounds.b_align(np.array([2, 1, 0], dtype=np.longdouble), 3, 3), want)
