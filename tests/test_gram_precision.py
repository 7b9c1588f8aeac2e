"""The float32 Gram path: every moment within a hundredth of its own standard error of the float64 result where it
is used (near-zero means, and up to its mean-ratio limit), float64 bit for bit everywhere else."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dalign_core.geometry import accumulator as accumulator_module
from dalign_core.geometry import estimators, rows
from dalign_core.geometry.accumulator import GeometryAccumulator
from dalign_core.geometry.estimators import estimate_geometry
from dalign_core.geometry.ustatistics import DIMENSIONS, MOMENTS

N, D = 512, 4096  # n^2 d = 2^30: the smallest Gram formed from float32 products


def _rows(n, d, ratio, spectrum="flat", seed=0):
    """float32 rows q = mu + z with ||mu||^2 = ratio * tr(Sigma); ``spectrum`` "power": variances 1/k (rank ~ log d)."""
    rng = np.random.default_rng(seed)
    scale = np.ones(d) if spectrum == "flat" else 1.0 / np.sqrt(np.arange(1, d + 1))
    noise = rng.standard_normal((n, d)) * scale
    mu = rng.standard_normal(d)
    mu *= math.sqrt(ratio * float((scale ** 2).sum())) / np.linalg.norm(mu)
    return torch.from_numpy((noise + mu).astype(np.float32))


def _spy(monkeypatch, module):
    calls = []
    real = module.float32_gram
    monkeypatch.setattr(module, "float32_gram", lambda *args: calls.append(args[0].shape) or real(*args))
    return calls


def _worst_in_standard_errors(got, want):
    return {name: abs(getattr(got, name) - getattr(want, name)) / want.intervals[name].se for name in MOMENTS + DIMENSIONS}


@pytest.mark.parametrize("ratio", [1e-3, rows.FLOAT32_MAX_MEAN_RATIO])
@pytest.mark.parametrize("spectrum", ["flat", "power"])
def test_float32_gram_is_within_a_hundredth_of_a_standard_error(monkeypatch, ratio, spectrum):
    Q = _rows(N, D, ratio * 0.9, spectrum)
    calls = _spy(monkeypatch, estimators)
    got = estimate_geometry(Q)
    assert calls == [(N, D)]  # the float32 path ran
    want = estimate_geometry(Q, precision="float64")
    worst = _worst_in_standard_errors(got, want)
    assert max(worst.values()) < 0.01, worst
    # and not by being the float64 result: the products really were float32 ones
    assert got.cov_energy != want.cov_energy
    for name in MOMENTS:  # the intervals move by no more than the estimates
        assert got.intervals[name].se == pytest.approx(want.intervals[name].se, rel=1e-3)


def test_the_streamed_estimate_takes_the_float32_path_too(monkeypatch):
    Q = _rows(N, D, 1e-3)
    calls = _spy(monkeypatch, accumulator_module)
    streamed = GeometryAccumulator()
    for batch in torch.split(Q, 100):
        streamed.update(batch)
    assert calls  # the later batches (once n^2 d >= 2^30) were multiplied in float32
    worst = _worst_in_standard_errors(streamed.result(), estimate_geometry(Q, precision="float64"))
    assert max(worst.values()) < 0.01, worst


def test_a_large_mean_is_multiplied_in_float64(monkeypatch):
    """At ||mu||^2 = 1000 tr(Sigma) float32 rounding reaches a few hundredths of an SE of tr(Sigma^2): float64 there."""
    Q = _rows(N, D, 1000.0)
    want = estimate_geometry(Q, precision="float64")
    got = estimate_geometry(Q)
    assert got == want  # bit for bit
    streamed = GeometryAccumulator()
    for batch in torch.split(Q, 128):
        streamed.update(batch)
    assert streamed._float32_entries  # the batches were multiplied in float32 ...
    assert streamed.result() == want  # ... and formed again in float64 at the result, bit for bit
    assert not streamed._float32_entries and streamed._float64_only
    streamed.update(Q[:4])  # later batches stay in float64
    assert not streamed._float32_entries


def test_small_grams_float64_rows_and_reduced_precision_products_stay_float64(monkeypatch):
    calls = _spy(monkeypatch, estimators)
    small = _rows(256, 4096, 1e-3)  # n^2 d = 2^28
    assert estimate_geometry(small) == estimate_geometry(small, precision="float64")
    wide = _rows(N, D, 1e-3)
    assert estimate_geometry(wide.double()) == estimate_geometry(wide.double(), precision="float64")
    assert estimate_geometry(wide * 2.0**50) == estimate_geometry(wide * 2.0**50, precision="float64")  # near overflow
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # products may be bfloat16 ones: not float32's accuracy
        assert estimate_geometry(wide) == estimate_geometry(wide, precision="float64")
    finally:
        torch.set_float32_matmul_precision(before)
    assert calls == []


def test_float32_gram_is_symmetric_and_close_to_the_float64_product(monkeypatch):
    monkeypatch.setattr(rows, "_FLOAT32_COLUMNS", 100)  # several column blocks
    monkeypatch.setattr(rows, "_FLOAT32_TILE_ROWS", 16)  # several row tiles
    A = _rows(200, 333, 0.5)
    G = rows.float32_gram(A)
    exact = A.double() @ A.double().T
    assert G.dtype == torch.float64 and torch.equal(G, G.T)
    torch.testing.assert_close(G, exact, rtol=1e-5, atol=1e-4)
    B = _rows(50, 333, 0.5, seed=1)
    torch.testing.assert_close(rows.float32_gram(A, B.to(torch.bfloat16)), A.double() @ B.to(torch.bfloat16).double().T,
                               rtol=1e-5, atol=1e-4)


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of 'auto', 'float64'"):
        estimate_geometry(_rows(8, 4, 0.1), precision="float32")
    with pytest.raises(ValueError, match="precision must be one of"):
        GeometryAccumulator(precision="half")
