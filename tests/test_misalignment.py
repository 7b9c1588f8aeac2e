"""Resampled misalignment probability against direct computation; the bigram baseline against counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dalign_repro.training.baselines import BigramModel, bigram_heldout_loss, unigram_heldout_loss
from dalign_core.geometry import rows
from dalign_core.geometry.misalignment import cross_gram, misalignment_probability, resample_alignment


def _pools(n1=40, n2=30, d=12, shift=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n1, d, generator=g) + shift, torch.randn(n2, d, generator=g) + shift


def test_cross_gram_blocked_matches_float64_product(monkeypatch):
    monkeypatch.setattr(rows, "_COLUMN_ELEMENTS", 64)  # many column blocks
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
    from dalign_core.geometry.misalignment import wilson_interval

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


def _uncached_statistics(C, M, K, trials, seed, one_pool, chunk):
    """The resampler as it was before its index sets were kept: every chunk drawn afresh (the reference)."""
    from dalign_core.geometry.misalignment import draw_indices

    n1, n2 = C.shape
    g = torch.Generator().manual_seed(seed)
    g_test = torch.Generator().manual_seed(seed + 0x5DEECE66D)
    flat = C.double().contiguous().numpy().reshape(-1)
    out = np.empty(trials)
    for start in range(0, trials, chunk):
        c = min(chunk, trials - start)
        if one_pool:
            idx = draw_indices(n1, M + K, c, g)
            I, J = idx[:, :M], idx[:, M:]
        else:
            I, J = draw_indices(n1, M, c, g), draw_indices(n2, K, c, g_test)
        lin = (I.numpy() * n2).astype(np.int32)[:, :, None] + J.numpy().astype(np.int32)[:, None, :]
        out[start:start + c] = np.take(flat, lin).sum(axis=(1, 2)) / (M * K)
    return torch.from_numpy(out)


@pytest.mark.parametrize("one_pool", [False, True])
def test_repeated_calls_reuse_the_index_sets_bit_for_bit(monkeypatch, one_pool):
    from dalign_core.geometry import misalignment

    misalignment.clear_index_cache()
    a, b = _pools()
    C = cross_gram(a) if one_pool else cross_gram(a, b)
    calls = []
    real_draw = misalignment.draw_indices
    monkeypatch.setattr(misalignment, "draw_indices", lambda *args: calls.append(args) or real_draw(*args))
    first = misalignment_probability(None, C=C, one_pool=one_pool, M=5, K=7, trials=3000, seed=2)
    drawn = len(calls)
    assert drawn > 0
    # the other setting of the sweep, on a Gram of the same shape, and the same setting again: no new draws
    other = cross_gram(a + 0.5) if one_pool else cross_gram(a, b - 0.2)
    misalignment_probability(None, C=other, one_pool=one_pool, M=5, K=7, trials=3000, seed=2)
    again = misalignment_probability(None, C=C, one_pool=one_pool, M=5, K=7, trials=3000, seed=2)
    assert len(calls) == drawn
    assert again.to_dict() | {"seconds": 0} == first.to_dict() | {"seconds": 0}
    chunk = max(1, min(3000, (1 << 18) // 35))
    reference = _uncached_statistics(C, 5, 7, 3000, 2, one_pool, chunk)
    assert torch.equal(resample_alignment(C, 5, 7, 3000, seed=2, one_pool=one_pool), reference)
    assert first.p_misalign == float((reference <= 0).sum()) / 3000 and first.mean == float(reference.mean())
    # another seed, budget or chunk is another key: drawn anew, and equal to the uncached draws
    for M, K, seed, chunk in ((5, 7, 3, 100), (4, 7, 2, 100), (5, 7, 2, 37)):
        assert torch.equal(resample_alignment(C, M, K, 300, seed=seed, one_pool=one_pool, chunk=chunk),
                           _uncached_statistics(C, M, K, 300, seed, one_pool, chunk))
    assert len(calls) > drawn
    # indices returned from cached draws are the uncached ones, and the kept arrays cannot be changed through them
    stats, I, J = resample_alignment(C, 5, 7, 300, seed=3, one_pool=one_pool, chunk=100, return_indices=True)
    I[:] = 0
    assert torch.equal(resample_alignment(C, 5, 7, 300, seed=3, one_pool=one_pool, chunk=100), stats)
    misalignment.clear_index_cache()


def test_index_cache_keeps_within_its_memory(monkeypatch):
    from dalign_core.geometry import misalignment

    misalignment.clear_index_cache()
    monkeypatch.setattr(misalignment, "INDEX_CACHE_BYTES", 300 * (5 + 7) * 4 * 2)  # room for two entries
    C = cross_gram(*_pools())
    for seed in range(4):
        resample_alignment(C, 5, 7, 300, seed=seed)
    assert len(misalignment._index_cache) == 2
    assert [key[5] for key in misalignment._index_cache] == [2, 3]  # the least recently used went first
    misalignment.clear_index_cache()


def test_resample_alignment_refuses_a_bad_chunk_and_an_impossible_number_of_trials():
    C = torch.randn(16, 16, dtype=torch.float64)
    for chunk in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="chunk must be a positive integer"):
            resample_alignment(C, 2, 2, 10, chunk=chunk, one_pool=True)
    with pytest.raises(ValueError, match="GiB of drawn indices"):
        resample_alignment(C, 2, 2, 10**10, one_pool=True)


@pytest.mark.parametrize("one_pool", [False, True])
@pytest.mark.parametrize("budget", [(24, 24), (16, 40), (40, 16)], ids=["square", "rows-first", "columns-first"])
def test_both_ways_of_summing_give_the_same_bits_and_the_first_call_keeps_the_faster(monkeypatch, one_pool, budget):
    from dalign_core.geometry import misalignment

    M, K = budget  # M K >= MATMUL_MIN_BLOCK: summed by gathering the block or by the indicator product
    assert M * K >= misalignment.MATMUL_MIN_BLOCK
    a, b = _pools(n1=120, n2=100)
    C = cross_gram(a) if one_pool else cross_gram(a, b)
    key = (*C.shape, M, K)
    misalignment._fastest_way.clear()
    bags = []
    real_bag = torch.nn.functional.embedding_bag
    monkeypatch.setattr(torch.nn.functional, "embedding_bag", lambda *args, **kw: bags.append(1) or real_bag(*args, **kw))
    # too few resamples for the race's rounds: nothing is kept
    few = resample_alignment(C, M, K, 20, seed=5, one_pool=one_pool, chunk=4)
    assert key not in misalignment._fastest_way and bags
    raced = resample_alignment(C, M, K, 600, seed=5, one_pool=one_pool, chunk=7)
    assert misalignment._fastest_way[key] in ("gather", "product") and torch.equal(raced[:20], few)
    for way in ("gather", "product"):
        misalignment._fastest_way[key] = way
        bags.clear()
        for chunk in (None, 7):
            assert torch.equal(resample_alignment(C, M, K, 600, seed=5, one_pool=one_pool, chunk=chunk), raced)
        assert bool(bags) == (way == "product")
    stats, I, J = resample_alignment(C, M, K, 50, seed=5, one_pool=one_pool, return_indices=True)
    test_pool = a if one_pool else b
    for r in range(50):
        assert abs(float(a[I[r]].double().mean(0) @ test_pool[J[r]].double().mean(0)) - float(stats[r])) < 1e-10
    misalignment._fastest_way.clear()


@pytest.mark.parametrize("one_pool", [False, True])
def test_small_blocks_are_gathered_whole_and_agree_with_the_indicator_product(one_pool):
    from dalign_core.geometry import misalignment

    a, b = _pools(n1=60, n2=50)
    C = cross_gram(a) if one_pool else cross_gram(a, b)
    gathered, I, J = resample_alignment(C, 6, 9, 600, seed=5, one_pool=one_pool, return_indices=True)
    assert 6 * 9 < misalignment.MATMUL_MIN_BLOCK and (6, 9) not in {key[2:] for key in misalignment._fastest_way}
    product = np.empty(600)
    rows = (I * C.shape[1]).numpy()
    misalignment._summed_blocks(C, 6, 9)["product"](rows, J.numpy(), product)
    torch.testing.assert_close(torch.from_numpy(product), gathered, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.from_numpy(product) <= 0, gathered <= 0)


@pytest.mark.parametrize("one_pool", [False, True])
def test_fewer_trials_take_the_first_kept_draws_and_blocks_do_not_matter(monkeypatch, one_pool):
    from dalign_core.geometry import misalignment

    a, b = _pools()
    C = cross_gram(a) if one_pool else cross_gram(a, b)
    misalignment.clear_index_cache()
    many = resample_alignment(C, 5, 7, 3000, seed=9, one_pool=one_pool)
    calls = []
    real_draw = misalignment.draw_indices
    monkeypatch.setattr(misalignment, "draw_indices", lambda *args: calls.append(args) or real_draw(*args))
    few = resample_alignment(C, 5, 7, 1000, seed=9, one_pool=one_pool)
    assert calls == [] and torch.equal(few, many[:1000])
    misalignment.clear_index_cache()
    monkeypatch.setattr(misalignment, "_DRAW_KEYS", 2000)  # draws in blocks of a few resamples
    assert torch.equal(resample_alignment(C, 5, 7, 1000, seed=9, one_pool=one_pool), few)
    assert len(calls) > 10
    misalignment.clear_index_cache()
