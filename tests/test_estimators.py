"""Gram U-statistic estimators: exactness against brute force, unbiasedness, streaming, devices, sketching."""

import itertools
import math

import numpy as np
import pytest
import torch

from dalign_core.geometry import rows, ustatistics
from dalign_core.geometry.accumulator import GeometryAccumulator
from dalign_core.geometry.bounds import dims_from_moments
from dalign_core.geometry.estimators import estimate_geometry, plugin_geometry
from dalign_core.geometry.ustatistics import geometry_from_gram
from dalign_core.geometry.synthetic import SyntheticQ

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
    sums = ustatistics._distinct_sums(torch.tensor(Q @ Q.T))
    loo = ustatistics._u_statistics(8, sums["s_loo"], sums["p2_loo"], sums["p3_loo"], sums["p4_loo"])
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
    monkeypatch.setattr(rows, "_COLUMN_ELEMENTS", 64)  # forces many column blocks
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


# ---------------------------------------------------------------------------
# Scale, dtypes and inputs that are not plain float arrays


def _assert_same_dimensions(got, want, rel=1e-12):
    for name in ("d_par", "d_2", "d_align"):
        assert getattr(got, name) == pytest.approx(getattr(want, name), rel=rel)
        for end in ("lo", "hi", "se"):
            assert getattr(got.intervals[name], end) == pytest.approx(getattr(want.intervals[name], end), rel=rel)


@pytest.mark.parametrize("factor", [1e200, 1e-170, 2.0**1000, 1e-300, 1e50])
def test_d_align_is_scale_invariant_at_any_scale(factor):
    rng = np.random.default_rng(11)
    Q = rng.normal(size=(30, 12)) + 0.4
    reference = estimate_geometry(Q)
    assert reference.d_align > 0 and reference.intervals["d_align"].hi > 0
    scaled = estimate_geometry(Q * factor)
    _assert_same_dimensions(scaled, reference)
    # the streaming estimator, fed in batches, agrees too
    accumulator = GeometryAccumulator()
    for batch in np.array_split(Q * factor, 4):
        accumulator.update(batch)
    _assert_same_dimensions(accumulator.result(), reference)
    # moments scale back exactly where float64 holds them
    if 1e-60 < factor < 1e60:
        assert scaled.mean_sq == pytest.approx(reference.mean_sq * factor**2, rel=1e-12)
        assert scaled.cov_energy == pytest.approx(reference.cov_energy * factor**4, rel=1e-12)
    elif factor > 1:  # beyond float64: inf, never a wrong finite number
        assert scaled.cov_energy == math.inf


def test_ordinary_scales_are_not_rescaled():
    """Inside 2^±200 nothing is rescaled: exact powers of two change the moments exactly and nothing else."""
    Q = np.random.default_rng(12).normal(size=(20, 6)) + 0.3
    one, four = estimate_geometry(Q), estimate_geometry(Q * 4.0)
    assert four.mean_sq == one.mean_sq * 16 and four.cov_energy == one.cov_energy * 256
    assert four.d_align == one.d_align


def test_gram_of_huge_entries_is_rescaled():
    Q = np.random.default_rng(13).normal(size=(12, 5)) + 0.5
    G = Q @ Q.T
    _assert_same_dimensions(geometry_from_gram(G * 1e250), geometry_from_gram(G))


def test_half_precision_batches_are_kept_in_float32():
    rng = np.random.default_rng(14)
    Q = rng.normal(size=(40, 10)) + 0.5
    accumulator = GeometryAccumulator()
    accumulator.update(torch.tensor(Q[:10], dtype=torch.float16))
    accumulator.update(torch.tensor(Q[10:] * 1e6, dtype=torch.float32))  # would be inf in float16
    assert accumulator.dtype == torch.float32 and bool(torch.isfinite(accumulator.rows()).all())
    stacked = np.vstack([torch.tensor(Q[:10], dtype=torch.float16).double().numpy(), Q[10:] * 1e6])
    assert accumulator.result().d_align == pytest.approx(estimate_geometry(stacked).d_align, rel=1e-5)
    # float64 batches are kept in float64, also after float32 ones
    mixed = GeometryAccumulator().update(torch.tensor(Q[:10], dtype=torch.float32)).update(Q[10:])
    assert mixed.dtype == torch.float64 and GeometryAccumulator().update(Q).dtype == torch.float64
    with pytest.raises(TypeError, match="floating torch dtype"):
        GeometryAccumulator(dtype=torch.int64)


def test_complex_input_is_refused():
    Q = np.random.default_rng(15).normal(size=(8, 4)) + 1j
    for bad in (Q, torch.tensor(Q), Q.astype(object)):
        with pytest.raises(TypeError, match="complex.*imaginary part would be lost"):
            estimate_geometry(bad)
    with pytest.raises(TypeError, match="complex"):
        GeometryAccumulator().update(torch.tensor(Q, dtype=torch.complex64))
    with pytest.raises(TypeError, match="complex"):
        geometry_from_gram(Q @ Q.T)


def test_unusual_numpy_arrays_give_the_answer_or_a_clear_error():
    Q = np.random.default_rng(16).normal(size=(10, 6)) + 0.5
    reference = estimate_geometry(Q)

    def same(other):
        assert other.d_align == pytest.approx(reference.d_align, rel=1e-12)

    same(estimate_geometry(Q.astype(object)))  # object array of floats
    same(estimate_geometry(Q.astype(np.longdouble)))
    same(estimate_geometry(Q.astype(">f8")))  # big-endian
    flipped = Q[::-1, ::-1]  # a view with negative strides: the same rows, reversed
    assert any(stride < 0 for stride in flipped.strides)
    same(estimate_geometry(flipped))
    same(estimate_geometry(np.ascontiguousarray(Q.T).T))  # Fortran order
    ints = np.arange(24).reshape(6, 4) % 5
    assert estimate_geometry(ints.astype(np.uint16)).d_align == estimate_geometry(ints.astype(float)).d_align
    with pytest.raises(TypeError, match=r"must hold real numbers, got numpy dtype <U.*astype\(float\)"):
        estimate_geometry(Q.astype(str))
    with pytest.raises(TypeError, match="must hold real numbers, got numpy dtype"):
        estimate_geometry(np.zeros((5, 3), dtype="datetime64[s]"))
    mixed = Q.astype(object)
    mixed[3, 2] = "x"
    with pytest.raises(TypeError, match=r"object array holding str 'x' at index \(3, 2\)"):
        estimate_geometry(mixed)
    if np.finfo(np.longdouble).max > np.finfo(np.float64).max:  # x86: 80-bit long double
        huge = Q.astype(np.longdouble)
        huge[0, 0] = np.longdouble(10) ** 400
        with pytest.raises(ValueError, match="beyond float64's range"):
            estimate_geometry(huge)
    with pytest.raises(TypeError, match="numpy array or torch tensor"):
        estimate_geometry(Q.tolist())


def test_sketch_dim_is_checked():
    Q = np.random.default_rng(17).normal(size=(8, 16))
    with pytest.raises(ValueError, match="sketch_dim=17 is larger than the rows' dimension d=16"):
        estimate_geometry(Q, sketch_dim=17)
    with pytest.raises(ValueError, match="sketch_dim=10000000000 is larger"):
        GeometryAccumulator(sketch_dim=10**10).update(Q)
    with pytest.raises(ValueError, match="positive integer"):
        estimate_geometry(Q, sketch_dim=0)
    for bad in (2.5, "8", True):
        with pytest.raises(TypeError, match="sketch_dim must be a positive integer or None"):
            estimate_geometry(Q, sketch_dim=bad)
    assert estimate_geometry(Q, sketch_dim=16).sketch_dim == 16  # k = d is allowed
    with pytest.raises(ValueError, match="confidence"):
        estimate_geometry(Q, confidence=1.0)


def test_a_gram_matrix_that_is_not_symmetric_is_refused():
    """A non-symmetric G gave a silently wrong d_align (0.0 where the true one is 0.12); rounding is accepted."""
    Q = np.random.default_rng(16).normal(size=(40, 10)) + 0.5
    G = Q @ Q.T
    n = len(Q)
    true = geometry_from_gram(G)
    bent = np.triu(G)  # the lower triangle zeroed: not a Gram matrix
    wrong = ustatistics.geometry_from_scaled_gram(torch.as_tensor(bent), 0, None, confidence=0.95, sketch_dim=None)
    assert abs(wrong.d_align - true.d_align) > 0.5 * true.d_align  # what the refusal prevents
    with pytest.raises(ValueError, match=r"G is not symmetric: G\[\d+, \d+\] = .* but G\[\d+, \d+\] = .*Q @ Q\.T"):
        geometry_from_gram(bent)
    with pytest.raises(ValueError, match="not symmetric"):
        geometry_from_gram(torch.as_tensor(G) + 1e-6 * torch.triu(torch.ones(n, n), 1) * float(np.abs(G).max()))
    # rounding of float32 products in another order is not refused, and the answer is the symmetric one's
    Q32 = torch.as_tensor(Q, dtype=torch.float32)
    G32 = torch.stack([torch.stack([(Q32[i] * Q32[j]).flip(0).sum() if i < j else Q32[i] @ Q32[j]
                                    for j in range(n)]) for i in range(n)])
    assert not torch.equal(G32, G32.T)
    assert geometry_from_gram(G32).d_align == pytest.approx(true.d_align, rel=1e-4)
    # float64 rounding: 1e-13 relative is accepted (the threshold scales with the matrix)
    jitter = torch.as_tensor(G) * (1 + 1e-13 * torch.triu(torch.ones(n, n), 1))
    assert geometry_from_gram(jitter * 1e250).d_align == pytest.approx(true.d_align, rel=1e-9)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_gram_matrix_with_nan_or_inf_is_refused(value):
    """A NaN entry gave mean_sq NaN and d_align 0 with the interval [0, 0]."""
    Q = np.random.default_rng(17).normal(size=(10, 8)) + 0.3
    G = Q @ Q.T
    G[2, 5] = G[5, 2] = value
    with pytest.raises(ValueError, match=r"G has 2 NaN or inf entries \(e\.g\. G\[2, 5\]"):
        geometry_from_gram(G)
