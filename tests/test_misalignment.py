"""Resampled misalignment probability against direct computation; the bigram baseline against counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dalign_core.baselines import BigramModel, bigram_heldout_loss, unigram_heldout_loss
from dalign_core import estimators
from dalign_core.misalignment import cross_gram, misalignment_probability, resample_alignment


def _pools(n1=40, n2=30, d=12, shift=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n1, d, generator=g) + shift, torch.randn(n2, d, generator=g) + shift


def test_cross_gram_blocked_matches_float64_product(monkeypatch):
    monkeypatch.setattr(estimators, "_COLUMN_ELEMENTS", 64)  # many column blocks
    a, b = _pools(d=50)
    C = cross_gram(a, b)
    assert C.dtype == torch.float64
    assert torch.allclose(C, a.double() @ b.double().T, rtol=0, atol=1e-12)
    assert torch.allclose(cross_gram(a.numpy()), a.double() @ a.double().T, atol=1e-12)


@pytest.mark.parametrize("one_pool", [False, True])
def test_resample_matches_explicit_means(one_pool):
    a, b = _pools()
    M, K, R = 5, 7, 300
    C = cross_gram(a) if one_pool else cross_gram(a, b)
    stats, I, J = resample_alignment(C, M, K, R, seed=4, one_pool=one_pool, chunk=37, return_indices=True)
    test_pool = a if one_pool else b
    for r in range(R):
        assert len(set(I[r].tolist())) == M and len(set(J[r].tolist())) == K
        if one_pool:
            assert not set(I[r].tolist()) & set(J[r].tolist())
        mu = a[I[r]].double().mean(0)
        g = test_pool[J[r]].double().mean(0)
        assert abs(float(mu @ g) - float(stats[r])) < 1e-10
    est = misalignment_probability(a, None if one_pool else b, M=M, K=K, trials=R, seed=4, chunk=37)
    assert est.p_misalign == float((stats <= 0).double().mean())
    assert math.isclose(est.p_misalign_se, math.sqrt(est.p_misalign * (1 - est.p_misalign) / R))
    assert math.isclose(est.mean, float(stats.mean())) and math.isclose(est.variance, float(stats.var()))
    # chunking does not change the draws
    again = resample_alignment(C, M, K, R, seed=4, one_pool=one_pool, chunk=300)
    assert torch.equal(again, stats)


def test_estimate_agrees_with_exact_moments_for_whole_pools():
    # M = n1, K = n2: every resample is the full means, so the statistic is constant
    a, b = _pools(n1=6, n2=5)
    est = misalignment_probability(a, b, M=6, K=5, trials=50)
    assert math.isclose(est.mean, float(a.double().mean(0) @ b.double().mean(0)), rel_tol=1e-12)
    assert est.variance < 1e-20 and est.p_misalign in (0.0, 1.0)


def test_input_validation():
    a, b = _pools()
    with pytest.raises(ValueError, match="exceeds the train pool"):
        misalignment_probability(a, b, M=41, K=2, trials=10)
    with pytest.raises(ValueError, match="exceeds the test pool"):
        misalignment_probability(a, b, M=2, K=31, trials=10)
    with pytest.raises(ValueError, match="disjoint"):
        misalignment_probability(a, M=30, K=11, trials=10)
    with pytest.raises(ValueError, match="d="):
        misalignment_probability(a, b[:, :5], M=2, K=2, trials=10)
    bad = a.clone()
    bad[3, 2] = float("nan")
    with pytest.raises(ValueError, match="q_train has 1 row\\(s\\) with NaN or inf"):
        misalignment_probability(bad, b, M=2, K=2, trials=10)
    with pytest.raises(ValueError):
        misalignment_probability(a, b, M=0, K=2, trials=10)


def test_bigram_against_direct_counts():
    train = torch.tensor([[0, 1, 2, 1, 2], [2, 1, 0, 1, 1]])
    held = torch.tensor([[1, 2, 0], [0, 1, 1]])
    V, k = 3, 0.5
    counts = np.zeros((V, V))
    for row in train.tolist():
        for x, y in zip(row[:-1], row[1:]):
            counts[x, y] += 1
    probs = (counts + k) / (counts.sum(1, keepdims=True) + k * V)
    pairs = [(x, y) for row in held.tolist() for x, y in zip(row[:-1], row[1:])]
    direct = -np.mean([np.log(probs[x, y]) for x, y in pairs])
    assert math.isclose(bigram_heldout_loss(train, held, V, k=k), direct, rel_tol=1e-12)
    assert math.isclose(BigramModel(train, V, k).loss(held), direct, rel_tol=1e-12)
    # a 1-D stream is one long sequence
    stream = torch.tensor([0, 1, 2, 0, 1])
    c = np.zeros((V, V))
    for x, y in zip(stream[:-1].tolist(), stream[1:].tolist()):
        c[x, y] += 1
    p = (c + k) / (c.sum(1, keepdims=True) + k * V)
    assert math.isclose(bigram_heldout_loss(stream, held, V, k=k),
                        -np.mean([np.log(p[x, y]) for x, y in pairs]), rel_tol=1e-12)
    loss, chosen = bigram_heldout_loss(train.repeat(10, 1), held, V, return_k=True)
    assert chosen > 0 and loss > 0
    assert unigram_heldout_loss(train, held, V) > 0
    with pytest.raises(ValueError, match="outside"):
        bigram_heldout_loss(train, torch.tensor([[0, 3]]), V, k=k)


def test_wilson_interval_is_honest_at_the_edges():
    from dalign_core.misalignment import wilson_interval

    z = 1.959963984540054
    lo, hi = wilson_interval(0, 1000)
    assert lo == 0.0 and hi == pytest.approx(z * z / (1000 + z * z))
    lo, hi = wilson_interval(1000, 1000)
    assert hi == 1.0 and lo == pytest.approx(1000 / (1000 + z * z))
    lo, hi = wilson_interval(500, 1000)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(2 * z * math.sqrt(0.25 / 1000), rel=0.01)
    # coverage: intervals at 95% cover the true p in about 95% of binomial draws
    rng = np.random.default_rng(0)
    covered = [lo <= 0.02 <= hi for lo, hi in (wilson_interval(int(k), 200) for k in rng.binomial(200, 0.02, 2000))]
    assert 0.92 < np.mean(covered) < 0.99
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)


def test_misalignment_estimate_carries_a_wilson_interval():
    a, b = _pools(shift=3.0)  # strongly aligned: no misaligned resample
    estimate = misalignment_probability(a, b, M=8, K=8, trials=500, seed=0)
    assert estimate.p_misalign == 0.0 and estimate.p_misalign_se == 0.0
    assert estimate.p_misalign_lo == 0.0 and 0.005 < estimate.p_misalign_hi < 0.01
