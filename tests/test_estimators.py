"""Gram U-statistic estimators: exactness against brute force, unbiasedness, streaming, devices, sketching."""

import itertools
import math

import numpy as np
import pytest
import torch

from dalign_core import estimators
from dalign_core.bounds import dims_from_moments
from dalign_core.estimators import GeometryAccumulator, estimate_geometry, geometry_from_gram, plugin_geometry
from dalign_core.synthetic import SyntheticQ

MOMENTS = ("mean_sq", "mean_sq_sq", "directional", "cov_energy")


def brute_force_u_statistics(Q):
    """Averages over explicitly enumerated distinct index tuples (the definition)."""
    G = Q @ Q.T
    idx = range(len(Q))
    pair = np.mean([G[i, j] for i, j in itertools.permutations(idx, 2)])
    quad = np.mean([G[i, j] * G[k, l] for i, j, k, l in itertools.permutations(idx, 4)])
    triple = np.mean([G[i, j] * G[j, k] for i, j, k in itertools.permutations(idx, 3)])
    square = np.mean([G[i, j] ** 2 for i, j in itertools.permutations(idx, 2)])
    return dict(mean_sq=pair, mean_sq_sq=quad, directional=triple - quad, cov_energy=square - 2 * triple + quad)


@pytest.mark.parametrize("seed,n,d", [(0, 4, 3), (1, 6, 2), (2, 7, 5), (3, 9, 12)])
def test_u_statistics_equal_brute_force(seed, n, d):
    rng = np.random.default_rng(seed)
    Q = rng.normal(size=(n, d)) + rng.normal(size=d)
    got = estimate_geometry(Q)
    want = brute_force_u_statistics(Q)
    for name in MOMENTS:
        assert getattr(got, name) == pytest.approx(want[name], rel=1e-9, abs=1e-12)
    dims = dims_from_moments(want["mean_sq_sq"], want["directional"], want["cov_energy"])
    assert got.d_align == pytest.approx(dims.d_align, rel=1e-9)


def test_jackknife_leave_one_out_equals_recomputation():
    rng = np.random.default_rng(11)
    Q = rng.normal(size=(9, 4)) + 1.0
    sums = estimators._distinct_sums(torch.tensor(Q @ Q.T))
    loo = estimators._u_statistics(8, sums["s_loo"], sums["p2_loo"], sums["p3_loo"], sums["p4_loo"])
    for m in range(9):
        deleted = estimate_geometry(np.delete(Q, m, axis=0))
        for name in MOMENTS + ("d_par", "d_2", "d_align"):
            assert float(loo[name][m]) == pytest.approx(getattr(deleted, name), rel=1e-8)


def test_unbiased_over_replicates():
    """Mean over replicates lies within 4 standard errors of the truth for every moment, d > n included."""
    rng = np.random.default_rng(5)
    law = SyntheticQ.random(40, "power", "student_t", 1.0, rng, rotate=True)
    law.mu = law.mu * 2.0
    truth = dict(
        mean_sq=float(law.mu @ law.mu), directional=law.directional, cov_energy=law.cov_energy,
    )
    truth["mean_sq_sq"] = truth["mean_sq"] ** 2
    replicates = np.array([[getattr(estimate_geometry(law.sample(12, rng)), m) for m in MOMENTS] for _ in range(1500)])
    mean, se = replicates.mean(axis=0), replicates.std(axis=0, ddof=1) / math.sqrt(len(replicates))
    for k, name in enumerate(MOMENTS):
        assert abs(mean[k] - truth[name]) < 4 * se[k], (name, mean[k], truth[name], se[k])
    # The plug-in tr(S^2) is far off at d > n: the reason the U-statistic exists.
    plug = np.mean([plugin_geometry(law.sample(12, rng)).cov_energy for _ in range(200)])
    assert plug > 1.5 * truth["cov_energy"]


def test_jackknife_interval_covers_truth_usually():
    rng = np.random.default_rng(9)
    law = SyntheticQ.random(16, "flat", "gaussian", 3.0, rng)
    covered = []
    for _ in range(200):
        interval = estimate_geometry(law.sample(64, rng)).intervals["cov_energy"]
        covered.append(interval.lo <= law.cov_energy <= interval.hi)
    assert 0.85 <= np.mean(covered) <= 1.0


def test_streaming_blocked_and_one_shot_agree(monkeypatch):
    rng = np.random.default_rng(2)
    Q = torch.tensor(rng.normal(size=(50, 37)) + 0.4, dtype=torch.float32)
    one_shot = estimate_geometry(Q)
    monkeypatch.setattr(estimators, "_COLUMN_ELEMENTS", 64)  # forces many column blocks
    blocked = estimate_geometry(Q)
    accumulator = GeometryAccumulator()
    for batch in torch.split(Q, [1, 7, 3, 20, 19]):
        accumulator.update(batch)
    streamed = accumulator.result()
    assert accumulator.n == 50 and accumulator.d == 37
    for name in MOMENTS + ("d_align",):
        reference = getattr(one_shot, name)
        assert getattr(blocked, name) == pytest.approx(reference, rel=1e-10)
        assert getattr(streamed, name) == pytest.approx(reference, rel=1e-10)
        assert streamed.intervals[name].se == pytest.approx(one_shot.intervals[name].se, rel=1e-8)
    torch.testing.assert_close(accumulator.gram(), (Q.double() @ Q.double().T), rtol=1e-6, atol=1e-6)


def test_numpy_and_torch_agree():
    rng = np.random.default_rng(4)
    Q = rng.normal(size=(30, 8)) + 0.5
    from_numpy = estimate_geometry(Q)
    from_torch64 = estimate_geometry(torch.tensor(Q))
    from_torch32 = estimate_geometry(torch.tensor(Q, dtype=torch.float32))
    for name in MOMENTS:
        assert getattr(from_torch64, name) == pytest.approx(getattr(from_numpy, name), rel=1e-12)
        assert getattr(from_torch32, name) == pytest.approx(getattr(from_numpy, name), rel=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_matches_cpu():
    Q = torch.randn(200, 300, generator=torch.Generator().manual_seed(0)) + 0.2
    cpu, gpu = estimate_geometry(Q), estimate_geometry(Q.cuda())
    for name in MOMENTS:
        assert getattr(gpu, name) == pytest.approx(getattr(cpu, name), rel=1e-6)


def test_too_few_examples_and_bad_rows():
    with pytest.raises(ValueError, match="at least 4 examples"):
        estimate_geometry(np.ones((3, 5)))
    with pytest.raises(ValueError, match="at least 4 examples"):
        GeometryAccumulator().update(np.ones((2, 5))).result()
    Q = np.random.default_rng(0).normal(size=(10, 4))
    Q[2, 1], Q[7, 0], Q[7, 3] = np.nan, np.inf, -np.inf
    with pytest.raises(ValueError, match="2 row\\(s\\) with NaN or inf out of 10"):
        estimate_geometry(Q)
    with pytest.raises(ValueError, match="shape \\(n, d\\)"):
        estimate_geometry(np.ones(10))
    with pytest.raises(ValueError, match="earlier batches had 4"):
        GeometryAccumulator().update(np.ones((5, 4))).update(np.ones((5, 3)))
    with pytest.raises(ValueError, match="square"):
        geometry_from_gram(np.ones((4, 5)))


def test_zero_mean_gradients_give_small_dimension():
    rng = np.random.default_rng(8)
    Q = rng.normal(size=(400, 10))
    Q -= Q.mean(axis=0)  # the sample mean is exactly zero: no direction to trust
    geometry = estimate_geometry(Q)
    assert geometry.mean_sq < 0  # the unbiased ||mu||^2 goes negative when there is no mean
    assert geometry.d_align < 1e-3
    assert geometry.b_exact(10, 10) > 0.95 and geometry.b_align(10, 10) > 0.99


@pytest.mark.parametrize("seed", range(3))
def test_sketch_error_shrinks_with_k_as_documented(seed):
    """cov_energy's relative inflation is about r/k, r = tr(Sigma)^2 / tr(Sigma^2); ||mu||^2 stays unbiased."""
    rng = np.random.default_rng(seed)
    law = SyntheticQ.random(2048, "power", "gaussian", 1.0, rng, rotate=False)
    law.mu = law.mu * (4.0 * law.cov_energy) ** 0.25
    Q = torch.tensor(law.sample(128, rng))
    exact = estimate_geometry(Q)
    rank = law.eigenvalues.sum() ** 2 / law.cov_energy
    errors = {}
    for k in (64, 512, 2048):
        sketched = estimate_geometry(Q, sketch_dim=k, seed=seed)
        assert sketched.sketch_dim == k
        errors[k] = sketched.cov_energy / exact.cov_energy - 1.0
        assert errors[k] == pytest.approx(rank / k, abs=0.5 * rank / k + 0.02)
        assert abs(sketched.mean_sq / exact.mean_sq - 1.0) < 6 * math.sqrt(2.0 / k)
    assert errors[64] > errors[512] > errors[2048] > -0.02


def test_sketch_streaming_matches_one_shot():
    Q = torch.randn(40, 300, generator=torch.Generator().manual_seed(1)) + 0.3
    one_shot = estimate_geometry(Q, sketch_dim=32, seed=7)
    accumulator = GeometryAccumulator(sketch_dim=32, seed=7)
    for batch in Q.split(9):
        accumulator.update(batch)
    assert accumulator.rows().shape == (40, 32)
    assert accumulator.result().cov_energy == pytest.approx(one_shot.cov_energy, rel=1e-10)


def test_plugin_matches_numpy_covariance():
    rng = np.random.default_rng(6)
    Q = rng.normal(size=(20, 6)) + 1.0
    mean, S = Q.mean(axis=0), np.cov(Q, rowvar=False)
    plug = plugin_geometry(Q)
    assert plug.method == "plug-in" and not plug.intervals
    assert plug.mean_sq == pytest.approx(mean @ mean)
    assert plug.directional == pytest.approx(mean @ S @ mean)
    assert plug.cov_energy == pytest.approx(np.trace(S @ S))


def test_geometry_row_and_bounds():
    Q = np.random.default_rng(3).normal(size=(30, 5)) + 1.0
    geometry = estimate_geometry(Q, confidence=0.9)
    row = geometry.to_row()
    assert {"d_align", "d_align_lo", "d_align_hi", "cov_energy_se", "n", "d"} <= set(row)
    assert row["d_align_lo"] <= row["d_align"] <= row["d_align_hi"]
    assert 0.0 <= geometry.b_exact(8, 8) <= geometry.b_align(8, 8) <= 1.0
