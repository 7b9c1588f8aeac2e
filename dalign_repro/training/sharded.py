"""Sharded q pools: the Gram merging of one pool whose rows are spread over torchrun's ranks.

With the rows of a pool spread over the ranks,
:func:`sharded_geometry` computes each rank's rows of the Gram matrix (every rank's
block is broadcast in turn, so no rank holds more than its own rows and one other
block) and gathers only four ``n``-vectors of row statistics: the U-statistics and
their jackknife need nothing else (:func:`dalign_core.geometry.ustatistics.row_statistics`).
:func:`sharded_cross_gram` gathers the whole cross-Gram matrix, which the misalignment
resampler takes (:func:`dalign_core.geometry.misalignment.misalignment_probability` with ``C=``).

In a world of one (no process group) both are the one-process estimates.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.distributed as dist

from dalign_core.geometry.rows import as_rows, gram_product
from dalign_core.geometry.ustatistics import Geometry, geometry_from_row_statistics
from dalign_repro.training.distributed import is_active

__all__ = ["sharded_geometry", "sharded_cross_gram"]


def _group_shape(group) -> tuple[int, int]:
    if group is None and not is_active():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _global(group, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _shapes(rows: torch.Tensor, group) -> list[tuple[int, int, str]]:
    mine = (int(rows.shape[0]), int(rows.shape[1]), str(rows.dtype))
    if group is None and not is_active():
        return [mine]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, mine, group=group)
    if len({(d, dtype) for _, d, dtype in out}) != 1:
        raise ValueError(f"every rank must hold rows of one dimension and dtype; got (n, d, dtype) = {out}")
    return out


def _blocks(rows: torch.Tensor, shapes, group) -> Iterator[tuple[int, torch.Tensor]]:
    """Each rank's rows in turn (``(source rank, block)``), broadcast from their owner: one foreign block at a time."""
    rank, size = _group_shape(group)
    for source in range(size):
        if source == rank:
            block = rows
        else:
            block = torch.empty(shapes[source][0], shapes[source][1], dtype=rows.dtype, device=rows.device)
        if size > 1:
            dist.broadcast(block, src=_global(group, source), group=group)
        yield source, block


def _gather_vector(values: torch.Tensor, counts: list[int], group) -> torch.Tensor:
    """The ranks' 1-D or 2-D tensors of ``counts[r]`` rows, concatenated in rank order on every rank."""
    if len(counts) == 1:
        return values
    widest = max(counts)
    padded = torch.zeros((widest,) + tuple(values.shape[1:]), dtype=values.dtype, device=values.device)
    padded[: values.shape[0]] = values
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:count] for part, count in zip(parts, counts)])


def _local_gram_rows(rows: torch.Tensor, other: torch.Tensor, shapes, group) -> torch.Tensor:
    """``rows @ other_all^T`` in float64: this rank's rows of the (cross-)Gram matrix, every rank's ``other`` rows."""
    offsets = [0]
    for n, _, _ in shapes:
        offsets.append(offsets[-1] + n)
    out = torch.zeros(rows.shape[0], offsets[-1], dtype=torch.float64, device=rows.device)
    for source, block in _blocks(other, shapes, group):
        out[:, offsets[source]:offsets[source + 1]] = gram_product(rows, block)
    return out


def sharded_geometry(rows, *, confidence: float = 0.95, group=None) -> Geometry:
    """:func:`~dalign_core.geometry.estimators.estimate_geometry` of all ranks' rows stacked in rank order, on every rank.

    ``rows``: this rank's ``(n_r, d)`` q rows (any ``n_r``, one ``d`` and dtype on every
    rank; on this rank's device: CUDA under NCCL). Each rank forms only its ``n_r x n``
    rows of the Gram matrix and the ranks exchange four ``n``-vectors of row statistics,
    so the estimate is that of the whole pool (to float rounding) while the ``O(n^2 d)``
    Gram work and the ``n x n`` memory are split over the ranks. ``group``: the ranks
    sharing the pool (default: all of them). In a world of one it is ``estimate_geometry``.
    """
    Q = as_rows(rows, "rows")
    shapes = _shapes(Q, group)
    rank, _ = _group_shape(group)
    counts = [n for n, _, _ in shapes]
    G = _local_gram_rows(Q, Q, shapes, group)  # (n_r, n)
    start = sum(counts[:rank])
    diag = G[torch.arange(Q.shape[0], device=G.device), start + torch.arange(Q.shape[0], device=G.device)]
    row = _gather_vector(G.sum(dim=1) - diag, counts, group)
    row_sq = (G * G).sum(dim=1) - diag * diag
    gram_row = G @ row
    local = torch.stack([diag, row_sq, gram_row], dim=1)
    gathered = _gather_vector(local, counts, group)
    stats = {"diag": gathered[:, 0], "row": row, "row_sq": gathered[:, 1], "gram_row": gathered[:, 2]}
    return geometry_from_row_statistics({k: v.cpu() for k, v in stats.items()}, shapes[0][1], confidence=confidence)


def sharded_cross_gram(train_rows, test_rows=None, *, group=None) -> torch.Tensor:
    """The whole cross-Gram matrix ``C = Q_train Q_test^T`` (float64, on every rank) from each rank's rows of both pools.

    Rows are stacked in rank order (rank 0's first). ``test_rows=None`` gives the Gram
    matrix of the train pool with itself. Each rank computes its rows of C and the
    ranks all-gather them; the misalignment resampler then runs on C
    (:func:`dalign_core.geometry.misalignment.misalignment_probability` with ``C=``), the same on
    every rank for the same seed.
    """
    A = as_rows(train_rows, "train_rows")
    B = A if test_rows is None else as_rows(test_rows, "test_rows")
    shapes_a, shapes_b = _shapes(A, group), _shapes(B, group)
    if shapes_a[0][1] != shapes_b[0][1]:
        raise ValueError(f"train rows have d={shapes_a[0][1]} but test rows have d={shapes_b[0][1]}")
    mine = _local_gram_rows(A, B, shapes_b, group)
    return _gather_vector(mine, [n for n, _, _ in shapes_a], group)
