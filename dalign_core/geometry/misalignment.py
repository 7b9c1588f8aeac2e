"""Empirical misalignment probability Pr(mu_M^T g_K <= 0) by resampling q pools.

Given a train pool ``Q_tr`` (n1, d) and a test pool ``Q_te`` (n2, d) of per-example
activation gradients, one resample draws M distinct train rows I and K distinct test
rows J (uniformly, without replacement, from a seeded ``torch.Generator``) and computes

    mu_M^T g_K = (1/M) sum_{i in I} q_i  .  (1/K) sum_{j in J} q_j = (1/(MK)) sum_{i,j} C[i, j]

with the cross-Gram matrix ``C = Q_tr Q_te^T``, formed once in float64 (blocked over d).
A resample then costs O(MK) additions instead of O(MKd); resamples are vectorized in
chunks, so 10^5 resamples take seconds for M, K <= 64. For budgets with ``M K >= 512`` a resample's
sum can also be read from the product of its 0/1 train indicators with C (the sum of its M rows of C,
by torch's embedding_bag, then K entries of that row): O(M n2) streamed additions instead of O(MK)
random reads. Both ways add in the same order and give the same bits; the first call for a shape
races them and later calls take the faster. The index sets are drawn once per (pool sizes, budget,
seed, one pool or two) and kept for the next call (a call with fewer trials takes the first ones: a
resample's indices depend only on its position in the stream).

With one pool (``q_test=None``) each resample draws M + K distinct rows and splits them
into disjoint train (first M) and test (last K) subsets; ``C`` is then the pool's Gram
matrix.

Note: resampling from finite pools estimates the misalignment probability of the pool's
empirical distribution drawn without replacement; for M, K much smaller than the pools it
approaches that of independent draws.  Compare with B_exact / B_align from
:mod:`dalign_core.geometry.bounds` computed on the estimated geometry.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass

import numpy as np
import torch

from dalign_core._tensor import check_finite
from dalign_core.geometry.rows import as_rows, gram_product

__all__ = [
    "MisalignmentEstimate",
    "clear_index_cache",
    "cross_gram",
    "draw_indices",
    "resample_alignment",
    "misalignment_probability",
    "wilson_interval",
]


@dataclass(frozen=True)
class MisalignmentEstimate:
    """Result of :func:`misalignment_probability`."""

    p_misalign: float
    """Fraction of resamples with ``mu_M^T g_K <= 0``."""
    p_misalign_se: float
    """Binomial standard error ``sqrt(p (1 - p) / trials)`` (0 at p = 0 or 1: use the interval there)."""
    p_misalign_lo: float
    p_misalign_hi: float
    """Wilson score interval at level ``confidence``; honest at p = 0 (``hi = z^2 / (R + z^2)``)."""
    confidence: float
    mean: float
    """Mean of ``mu_M^T g_K`` over resamples."""
    variance: float
    """Sample variance (ddof=1) of ``mu_M^T g_K`` over resamples."""
    M: int
    K: int
    trials: int
    seed: int
    disjoint_from_one_pool: bool
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def cross_gram(q_train, q_test=None) -> torch.Tensor:
    """``C = Q_tr Q_te^T`` in float64, shape (n1, n2), on the pools' device.

    Accumulated over column blocks of d (see :func:`dalign_core.geometry.estimators.gram_product`),
    so a float32 pool of any d needs little extra memory. ``q_test=None`` gives the Gram
    matrix of ``q_train`` with itself. Pools with NaN or inf rows are refused.
    """
    a = as_rows(q_train, "q_train")
    b = a if q_test is None else as_rows(q_test, "q_test")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"q_train has d={a.shape[1]} but q_test has d={b.shape[1]}; the pools must match")
    if a.device != b.device:
        raise ValueError(f"q_train is on {a.device} and q_test on {b.device}")
    return gram_product(a, b)


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion: ``(lo, hi)`` in [0, 1].

    Unlike the normal interval ``p +- z se``, it never collapses to a point: with no
    successes in R trials it is ``[0, z^2 / (R + z^2)]`` (about ``3.8 / R`` at 95%).
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, trials={trials}], got {successes}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # At p = 0 (or 1) the exact bound is 0 (or 1); clamp the rounding.
    return (0.0 if successes == 0 else max(0.0, centre - half), 1.0 if successes == trials else min(1.0, centre + half))


def draw_indices(n: int, size: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` rows of ``size`` distinct indices from ``range(n)``, int64 tensor (count, size).

    Uniform without replacement: the positions of the ``size`` smallest of ``n`` i.i.d.
    uniforms from ``generator`` (found with ``np.argpartition``; their order is arbitrary).
    """
    keys = torch.rand(count, n, generator=generator, dtype=torch.float32).numpy()
    if size == n:
        return torch.from_numpy(np.argsort(keys, axis=1))
    return torch.from_numpy(np.ascontiguousarray(np.argpartition(keys, size - 1, axis=1)[:, :size]))


def resample_alignment(
    C: torch.Tensor,
    M: int,
    K: int,
    trials: int,
    *,
    seed: int = 0,
    one_pool: bool = False,
    chunk: int | None = None,
    return_indices: bool = False,
):
    """The statistic ``mu_M^T g_K`` for ``trials`` resamples, float64 tensor (trials,).

    ``C`` is the cross-Gram (n1, n2) (or with ``one_pool=True`` the square Gram of one
    pool, with disjoint train/test rows per resample).  Each resample gathers its M x K
    block of ``C`` and sums it: O(MK) work, done for ``chunk`` resamples at once; for budgets
    with ``M K >=`` :data:`MATMUL_MIN_BLOCK` the sum may come from the product of the resample's 0/1
    indicators with ``C`` instead, whichever is faster here (:func:`_block_means`: the same bits either way).
    ``return_indices=True`` also returns the (trials, M) and (trials, K) index tensors
    (for testing; memory grows with trials).  Deterministic given ``seed``, whatever
    the ``chunk``.  The index sets drawn for ``(n1, n2, M, K, seed, one_pool)`` are kept
    (up to :data:`INDEX_CACHE_BYTES`, least recently used first out) and reused by the
    next call with the same key and at most as many trials: the statistics are the same
    bit for bit, without drawing again (:func:`clear_index_cache` forgets them).
    """
    n1, n2 = C.shape
    _check_budget(M, K, n1, n2, one_pool)
    _check_trials(trials, chunk, M, K)
    trials, chunk = int(trials), (None if chunk is None else int(chunk))
    C = C.detach().to(device="cpu", dtype=torch.float64).contiguous()
    rows, cols = _index_sets(n1, n2, M, K, trials, int(seed), bool(one_pool))
    stats = torch.from_numpy(_block_means(C, rows, cols, M, K, chunk))
    if return_indices:
        return stats, torch.from_numpy((rows // n2).astype(np.int64)), torch.from_numpy(cols.astype(np.int64))
    return stats


def _check_trials(trials, chunk, M: int, K: int) -> None:
    """Refuse a number of resamples or a chunk that is not a positive integer, and draws of more than 8 GiB."""
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1):
        raise ValueError(f"chunk must be a positive integer number of resamples per block, or None; got {chunk!r}")
    need = int(trials) * (M + K + 1) * 8  # the drawn indices and the statistics, in bytes
    if need > 8 * 2**30:
        raise ValueError(f"trials={trials} resamples of M={M}, K={K} need about {need / 2**30:.0f} GiB of drawn "
                         "indices; use fewer trials")


def _summed_blocks(C: torch.Tensor, M: int, K: int):
    """The two ways of summing resamples' M x K blocks of the float64 (n1, n2) ``C``, each a function
    ``(rows, cols, out)`` filling ``out`` (chunk,) with the means of the blocks of ``rows`` (chunk, M), flat offsets of
    the train rows (row index x n2), and ``cols`` (chunk, K), the test columns: ``{"gather": ..., "product": ...}``.

    Both add in one order, so they give the same bits: first along the side with less to add per resample (the M
    train rows where ``M n2 <= K n1``, else the K test columns), one entry after the other, then torch's sum of the
    K (or M) partial sums. ``gather`` reads the block's entries (O(MK) random reads); ``product`` sums the whole
    rows (or columns) of C that the resample picks, by torch's embedding_bag (the product of the 0/1 indicators with
    C: O(M n2) streamed additions), then takes the other side's entries of the summed row.
    """
    n1, n2 = C.shape
    flat = C.numpy().reshape(-1)
    by_rows = M * n2 <= K * n1
    scale = M * K
    table = []  # C, or its transpose for summing columns, made on the product's first use

    def gather(rows, cols, out):
        # one train row (or test column) of every resample's block at a time, added to the partial sums (chunk, K)
        # (or (chunk, M)): no (chunk, M, K) block in memory, and the product's order of additions
        lines, across = (rows, cols) if by_rows else (cols, rows)
        partial = np.take(flat, lines[:, 0, None] + across)
        for line in range(1, lines.shape[1]):
            partial += np.take(flat, lines[:, line, None] + across)
        out[:] = torch.from_numpy(partial).sum(dim=1).numpy() / scale

    def product(rows, cols, out):
        if not table:
            table.append(C if by_rows else C.T.contiguous())
        train = torch.from_numpy((rows // n2).astype(np.int64))
        test = torch.from_numpy(cols.astype(np.int64))
        bags, picks = (train, test) if by_rows else (test, train)
        summed = torch.nn.functional.embedding_bag(bags, table[0], mode="sum")
        out[:] = summed.gather(1, picks).sum(dim=1).numpy() / scale

    return {"gather": gather, "product": product}


def _block_means(C: torch.Tensor, rows: np.ndarray, cols: np.ndarray, M: int, K: int,
                 chunk: int | None) -> np.ndarray:
    """Each resample's mean of its M x K block of the float64 (n1, n2) ``C`` (float64, (trials,)): ``rows``
    (trials, M) are flat offsets of the train rows (row index x n2), ``cols`` (trials, K) the test columns.

    Small blocks (``M K <`` :data:`MATMUL_MIN_BLOCK`) are gathered and summed whole, ``chunk`` resamples at a time.
    Larger ones take the faster of :func:`_summed_blocks`' two ways, which give the same bits: which is faster
    depends on the budget, the pools' sizes and the CPU's caches, so the first call for a shape races them on its
    first chunks (:data:`RACE_ROUNDS` each, kept as results) and :data:`_fastest_way` keeps the winner.
    """
    n1, n2 = C.shape
    trials = len(rows)
    out = np.empty(trials, dtype=np.float64)
    if M * K < MATMUL_MIN_BLOCK:
        flat = C.numpy().reshape(-1)
        chunk = chunk or max(1, (1 << 18) // (M * K))  # a gathered block (chunk, M, K) of about 2^18 entries
        for start in range(0, trials, chunk):
            r, c = rows[start:start + chunk], cols[start:start + chunk]
            out[start:start + len(r)] = np.take(flat, r[:, :, None] + c[:, None, :]).sum(axis=(1, 2)) / (M * K)
        return out
    ways = _summed_blocks(C, M, K)
    # partial sums of about 2^16 entries, or summed rows of about 2^18, a chunk
    across = K if M * n2 <= K * n1 else M
    chunks = {"gather": chunk or max(1, (1 << 16) // across), "product": chunk or max(1, (1 << 18) // max(n1, n2))}

    def run(way: str, start: int) -> int:
        end = min(trials, start + chunks[way])
        ways[way](rows[start:end], cols[start:end], out[start:end])
        return end

    key, start = (n1, n2, M, K), 0
    if key not in _fastest_way:
        seconds = dict.fromkeys(ways, math.inf)  # per resample, the best chunk of each way
        for _ in range(RACE_ROUNDS):
            for way in ways:
                if start < trials:
                    began = time.perf_counter()
                    end = run(way, start)
                    seconds[way] = min(seconds[way], (time.perf_counter() - began) / (end - start))
                    start = end
        if start < trials:  # every way ran all its rounds
            _fastest_way[key] = min(seconds, key=seconds.get)
    way = _fastest_way.get(key, "product")
    while start < trials:
        start = run(way, start)
    return out


MATMUL_MIN_BLOCK = 512
"""Budgets with ``M K`` below this are always gathered: their blocks stay in cache and a gather is cheapest."""

RACE_ROUNDS = 3
"""Chunks each way runs in the race of a shape's first call (:func:`_block_means`): the best of three, as a loaded
CPU slows single chunks."""

_fastest_way: dict[tuple[int, int, int, int], str] = {}
"""The faster way of summing blocks, by (n1, n2, M, K), as raced by this process's first call of that shape (the
ways give the same bits, so the choice changes no result)."""

INDEX_CACHE_BYTES = 256 * 2**20
"""Memory the drawn index sets of recent :func:`resample_alignment` calls may keep (least recently used go first)."""

_DRAW_KEYS = 1 << 22
"""Uniform keys drawn per call of :func:`draw_indices` (16 MiB of float32): the draws do not depend on it."""

_index_cache: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
_index_cache_lock = threading.Lock()


def clear_index_cache() -> None:
    """Forget the index sets kept by :func:`resample_alignment`."""
    with _index_cache_lock:
        _index_cache.clear()


def _draw_index_sets(n1, n2, M, K, trials, seed, one_pool) -> tuple[np.ndarray, np.ndarray]:
    """The train rows' offsets ``I * n2`` (trials, M) and the test columns ``J`` (trials, K), read-only.

    Drawn in blocks of about :data:`_DRAW_KEYS` keys: a resample's indices are the same whatever the block,
    because each stream's keys are consumed in order, one row of ``n`` keys a resample.
    """
    # separate streams for train and test rows, so the draws do not depend on how they are blocked
    g = torch.Generator().manual_seed(seed)
    g_test = torch.Generator().manual_seed(seed + 0x5DEECE66D)
    index_dtype = np.int32 if n1 * n2 < 2**31 else np.int64
    rows = np.empty((trials, M), dtype=index_dtype)
    cols = np.empty((trials, K), dtype=index_dtype)
    block = max(1, _DRAW_KEYS // (n1 + (0 if one_pool else n2)))
    for start in range(0, trials, block):
        c = min(block, trials - start)
        if one_pool:
            idx = draw_indices(n1, M + K, c, g).numpy()
            I, J = idx[:, :M], idx[:, M:]
        else:
            I = draw_indices(n1, M, c, g).numpy()
            J = draw_indices(n2, K, c, g_test).numpy()
        rows[start:start + c] = I * n2
        cols[start:start + c] = J
    rows.flags.writeable = cols.flags.writeable = False
    return rows, cols


def _index_sets(n1, n2, M, K, trials, seed, one_pool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_draw_index_sets`, kept for the next call with the same pools' sizes, budgets, seed and pools.

    The sweep resamples many (setting, budget) pairs from pools of the same size with the same seed; drawing the
    index sets is most of a first resampling's time, and the draws depend on nothing else. A kept draw of at least
    ``trials`` resamples serves a call of ``trials`` with its first rows (the same indices a fresh draw gives).
    """
    key = (n1, n2, M, K, one_pool, seed)
    with _index_cache_lock:
        draws = _index_cache.get(key)
        if draws is not None and len(draws[0]) >= trials:
            _index_cache.move_to_end(key)
            return draws[0][:trials], draws[1][:trials]
    draws = _draw_index_sets(n1, n2, M, K, trials, seed, one_pool)
    size = draws[0].nbytes + draws[1].nbytes
    with _index_cache_lock:
        if size <= INDEX_CACHE_BYTES:
            _index_cache[key] = draws
            _index_cache.move_to_end(key)
            while sum(r.nbytes + c.nbytes for r, c in _index_cache.values()) > INDEX_CACHE_BYTES:
                _index_cache.popitem(last=False)
    return draws


def _check_budget(M, K, n1, n2, one_pool):
    for name, v in (("M", M), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer number of examples, got {v!r}")
    if one_pool:
        if n1 != n2:
            raise ValueError(f"one_pool=True needs a square Gram matrix, got {n1}x{n2}")
        if M + K > n1:
            raise ValueError(f"M + K = {M + K} disjoint rows requested from a pool of {n1}")
    else:
        if M > n1:
            raise ValueError(f"M = {M} exceeds the train pool size n1 = {n1}")
        if K > n2:
            raise ValueError(f"K = {K} exceeds the test pool size n2 = {n2}")


def _checked_gram(q_train, q_test, C, one_pool: bool) -> torch.Tensor:
    """The cross-Gram the resamples read: ``C`` as given (checked 2-D and finite), else :func:`cross_gram` of the
    pools (one pool with ``one_pool``)."""
    if C is None:
        if q_train is None:
            raise ValueError("pass q_train (and q_test) or a precomputed C")
        if one_pool and q_test is not None:
            raise ValueError("one_pool=True takes a single pool: pass q_test=None")
        return cross_gram(q_train, q_test)
    if not isinstance(C, torch.Tensor) or C.ndim != 2:
        raise ValueError("C must be a 2-D tensor from cross_gram")
    check_finite(C, "C")
    return C


def misalignment_probability(
    q_train,
    q_test=None,
    *,
    M: int,
    K: int,
    trials: int = 100_000,
    seed: int = 0,
    C: torch.Tensor | None = None,
    one_pool: bool | None = None,
    chunk: int | None = None,
    confidence: float = 0.95,
) -> MisalignmentEstimate:
    """Estimate ``Pr(mu_M^T g_K <= 0)`` from ``trials`` resamples of the q pools.

    Args:
        q_train: train pool (n1, d), torch or numpy, any float dtype.
        q_test: test pool (n2, d); None draws disjoint train and test subsets from
            ``q_train`` alone.
        M, K: train and test sample budgets (M <= n1, K <= n2; M + K <= n1 for one pool).
        trials: number of resamples R.
        seed: seeds the index draws (torch.Generator).
        C: a precomputed :func:`cross_gram` (then ``q_train``/``q_test`` may be None);
            reuse it across (M, K) budgets.
        one_pool: whether ``C`` is one pool's Gram matrix (disjoint subsets drawn);
            default: True when only ``q_train`` is given, False otherwise.
        chunk: resamples per vectorized chunk (default: about 2^18 gathered or summed entries).
        confidence: level of the Wilson interval on ``p_misalign``.

    Returns:
        :class:`MisalignmentEstimate` with ``p_misalign``, its Wilson interval and
        standard error, and the mean and variance of the statistic.
    """
    t0 = time.perf_counter()
    if one_pool is None:
        one_pool = q_test is None and q_train is not None
    C = _checked_gram(q_train, q_test, C, one_pool)
    stats = resample_alignment(C, M, K, trials, seed=seed, one_pool=one_pool, chunk=chunk)
    misaligned = int((stats <= 0).sum())
    p = misaligned / trials
    lo, hi = wilson_interval(misaligned, trials, confidence)
    return MisalignmentEstimate(
        p_misalign=p,
        p_misalign_se=math.sqrt(p * (1.0 - p) / trials),
        p_misalign_lo=lo,
        p_misalign_hi=hi,
        confidence=confidence,
        mean=float(stats.mean()),
        variance=float(stats.var(correction=1)) if trials > 1 else float("nan"),
        M=int(M), K=int(K), trials=int(trials), seed=int(seed),
        disjoint_from_one_pool=one_pool,
        seconds=time.perf_counter() - t0,
    )
