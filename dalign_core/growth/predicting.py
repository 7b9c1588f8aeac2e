"""What a growth method reads at each insertion point before growing, and which way each reading points.

**Predictors** (:func:`predictors`), from one capture per layer on the sweep's pools:

* ``d_align``, ``d_par``, ``d_2``, ``mean_sq`` on the held-out pool, of the family's
  judged q (:attr:`dalign_repro.sweep.family.Family.reductions`), by the unbiased Gram
  U-statistics of :mod:`dalign_core.geometry.ustatistics` with jackknife intervals:
  ``d_∥ = ‖μ̄‖⁴/(μ̄ᵀΣμ̄)``, ``d_2 = ‖μ̄‖⁴/tr(Σ²)``, ``d_align = min(d_∥, d_2)``.
* ``alignment_M`` = μ_Mᵀg_K for a budget M = K: the mean q of the first M train-pool
  examples against that of the first K held-out ones (one draw, the same examples at
  every point: what a growth method with that budget would see). Its interval is
  ``± z·sd`` with the exact variance ``(1/M + 1/K) μ̄ᵀΣμ̄ + tr(Σ²)/(MK)`` at the held-out
  estimates.
* ``b_align_M`` = ``1/(1 + n_eff(M, M) d_align)``, lower is better; its interval comes
  from d_align's (ends swapped). It is a monotone function of d_align, so it ranks
  exactly as d_align does: it is listed because it is the certificate the paper offers.
* ``grad_norm``, the plain baseline: ``‖G‖`` for the gradient G of the mean train-pool
  loss with respect to W₂ of the zero-output block inserted at the point (the block
  :func:`grow` trains, same W₁). At W₂ = 0 the per-example gradient is
  ``g_i = Σ_t q_{i,t} σ(W₁ z_{i,t})ᵀ``, so G comes from the same capture of z and q;
  its interval is a delete-a-group jackknife over ``groups`` interleaved groups of
  examples.
* ``random``, the null baseline: a uniform draw per point, seeded by the model and point.

:data:`SIGN` says which way each predictor points: +1 (higher = grow here) or −1 (B_align).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from dalign_core.seeding import derived_seed
from dalign_core.geometry.bounds import b_align
from dalign_core.geometry.ustatistics import Geometry
from dalign_core.capture.batches import conform_batch
from dalign_core.capture.batches import split_batch as _split_batch
from dalign_core.capture.batches import targets_from_labels as _targets_from_labels
from dalign_core.capture.gradients import layer_gradients as _gradients
from dalign_core.capture.gradients import primary_output as _primary
from dalign_core.capture.hooks import accumulate_geometry
from dalign_core.capture.hooks import reduce_gradient as _reduce
from dalign_core.capture.layers import resolve_layers
from dalign_core.capture.refusals import check_capturable
from dalign_core.growth.blocks import ZeroOutputBlock, block_for, feature_dim

__all__ = ["BASE_PREDICTORS", "predictor_names", "SIGN", "PointStats", "predictors", "order", "point_rows",
           "two_sided_z"]


BASE_PREDICTORS = ("d_align", "d_par", "d_2", "mean_sq", "grad_norm", "random")
"""Predictors that do not depend on a budget (``alignment_M`` and ``b_align_M`` do)."""


def predictor_names(budgets: Sequence[int]) -> list[str]:
    """Every predictor column for the budgets M = K in ``budgets``, in the table's order."""
    return ["d_align", "d_par", "d_2", "mean_sq"] + [f"alignment_{m}" for m in budgets] + \
        [f"b_align_{m}" for m in budgets] + ["grad_norm", "random"]


def SIGN(name: str) -> int:  # noqa: N802  (a table of signs, written as a function of the column name)
    """+1 when a higher value of predictor ``name`` says "grow here", −1 when a lower one does (B_align)."""
    return -1 if name.startswith("b_align") else 1


@dataclass(frozen=True)
class PointStats:
    """What a growth method can read at one insertion point before growing: each predictor and its interval."""

    layer: str
    values: dict
    """predictor name → value."""
    intervals: dict
    """predictor name → (lo, hi); NaN where none applies (``random``)."""
    geometry: Geometry


def _train_pass(model, layers: list[str], batches, reduction: str, blocks: dict[str, ZeroOutputBlock], keep: int,
                groups: int) -> tuple[dict, dict, list[int]]:
    """One forward and backward per batch: the first ``keep`` q rows per layer and the block gradients' group sums.

    Returns (rows per layer ``(≤keep, d)`` float64, group sums per layer ``(groups, N, H)`` float64, group sizes).
    """
    check_capturable(model)
    modules = resolve_layers(model, layers)
    device = next(model.parameters()).device
    rows = {name: [] for name in modules}
    sums: dict[str, torch.Tensor | None] = {name: None for name in modules}
    sizes = [0] * groups
    seen = 0
    for batch in batches:
        inputs, targets = _split_batch(batch)
        targets = _targets_from_labels(inputs, targets)
        inputs, targets = conform_batch(model, inputs, targets, device)
        zs: dict[str, torch.Tensor] = {}

        def keep_z(name):
            def hook(_module, _args, output):
                zs[name] = _primary(output)[0].detach()
            return hook

        handles = [m.register_forward_hook(keep_z(name)) for name, m in modules.items()]
        try:
            grads = _gradients(model, modules, inputs, targets, "auto", None)
        finally:
            for handle in handles:
                handle.remove()
        b = next(iter(grads.values())).shape[0]
        index = torch.arange(seen, seen + b)
        for name, grad in grads.items():
            if len(rows[name]) < keep:
                rows[name].extend(_reduce(grad, reduction).to("cpu", torch.float64)[: keep - len(rows[name])])
            z = zs[name]
            with torch.no_grad():
                h = blocks[name].features(z.to(blocks[name].w1.dtype))  # (b, positions…, H)
                q = torch.movedim(grad, feature_dim(grad), -1).to(h.dtype)  # (b, positions…, N)
                h, q = h.reshape(b, -1, h.shape[-1]), q.reshape(b, -1, q.shape[-1])
                if sums[name] is None:
                    sums[name] = torch.zeros(groups, q.shape[-1], h.shape[-1], dtype=torch.float64)
                for g in range(groups):
                    members = (index % groups == g).nonzero().flatten()
                    if len(members):
                        part = q[members].reshape(-1, q.shape[-1]).T @ h[members].reshape(-1, h.shape[-1])
                        sums[name][g] += part.to("cpu", torch.float64)
        for g in range(groups):
            sizes[g] += int((index % groups == g).sum())
        seen += b
    return {k: torch.stack(v) for k, v in rows.items()}, sums, sizes


@functools.lru_cache(maxsize=16)
def two_sided_z(confidence: float) -> float:
    """The standard normal quantile at ``1 - (1 - confidence) / 2`` (1.96 at 0.95).

    SciPy's ``ndtri`` where SciPy is installed (the reproduction's tables were computed with it), else the standard
    library's ``NormalDist`` (SciPy is not a requirement of the core): the two differ by at most a few units in the
    last place, so an interval's ends can differ in their last digit between the two installs. Cached: the growth
    study's calibration simulations ask for the same few levels thousands of times.
    """
    p = 1 - (1 - confidence) / 2
    try:
        from scipy.special import ndtri  # 0.4 s to import, against scipy.stats' 1.7 s
    except ImportError:
        return statistics.NormalDist().inv_cdf(p)
    return float(ndtri(p))


def _jackknife_norm(sums: torch.Tensor, sizes: Sequence[int], confidence: float) -> tuple[float, float, float]:
    """‖Σ_g S_g / n‖ and its delete-a-group jackknife interval (normal quantile)."""
    n = sum(sizes)
    total = sums.sum(0)
    estimate = float(total.norm() / n)
    used = [g for g, size in enumerate(sizes) if size]
    if len(used) < 2:
        return estimate, math.nan, math.nan
    leave = np.array([float((total - sums[g]).norm() / (n - sizes[g])) for g in used])
    G = len(used)
    se = math.sqrt((G - 1) / G * float(((leave - leave.mean()) ** 2).sum()))
    z = two_sided_z(confidence)
    return estimate, estimate - z * se, estimate + z * se


def _moments(geometry) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """d_align, d_par, d_2 and ‖μ‖² of ``geometry`` with their intervals (NaN where it has none)."""
    values, intervals = {}, {}
    for name in ("d_align", "d_par", "d_2", "mean_sq"):
        values[name] = getattr(geometry, name)
        ci = geometry.intervals.get(name)
        intervals[name] = (ci.lo, ci.hi) if ci is not None else (math.nan, math.nan)
    return values, intervals


def _at_budgets(geometry, d_align_interval: tuple[float, float], train_rows: torch.Tensor,
                heldout_rows: torch.Tensor, budgets: Sequence[int],
                z: float) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """At each budget m = M = K: μ_mᵀg_m of the first m train and held-out rows (its normal interval from the
    geometry's variance terms, ``z`` its quantile) and B_align(d_align, m, m) (its interval from d_align's)."""
    values, intervals = {}, {}
    d_lo, d_hi = d_align_interval
    for m in budgets:
        alignment = float(train_rows[:m].mean(0) @ heldout_rows[:m].mean(0))
        variance = max((2 / m) * geometry.directional + geometry.cov_energy / (m * m), 0.0)
        values[f"alignment_{m}"] = alignment
        intervals[f"alignment_{m}"] = (alignment - z * math.sqrt(variance), alignment + z * math.sqrt(variance))
        at = lambda d: float(b_align(max(d, 0.0), m, m)) if math.isfinite(d) else math.nan  # noqa: E731
        values[f"b_align_{m}"] = at(geometry.d_align)
        intervals[f"b_align_{m}"] = (at(d_hi), at(d_lo))
    return values, intervals


def predictors(model: nn.Module, layers: Sequence[str], heldout_batches: list, train_batches: list, *,
               reduction: str = "shared", budgets: Sequence[int] = (16, 64), hidden: int | None = None,
               block_seed: int = 0, confidence: float = 0.95, groups: int = 10, random_key: Any = 0,
               check_determinism: bool = True) -> dict[str, PointStats]:
    """Every predictor of the module docstring at each of ``layers``, with intervals.

    Args:
        model: a trained model in a capturable state (eval mode for BatchNorm or dropout).
        layers: insertion points (dotted module names).
        heldout_batches: held-out examples (the geometry; the K of ``alignment_M``).
        train_batches: training examples (the M of ``alignment_M``; the block gradient).
        reduction: the q whose geometry is measured (``"shared"`` or ``"full"``).
        budgets: M = K of ``alignment_M`` and ``b_align_M``; each at most the examples of either set.
        hidden, block_seed: the zero-output block of ``grad_norm`` (as :func:`grow` draws it).
        groups: groups of the jackknife of ``grad_norm``.
        random_key: seeds the ``random`` predictor (with the layer's name).

    Returns:
        layer → :class:`PointStats`, in the order of ``layers``.
    """
    layers = list(resolve_layers(model, list(layers)))
    z = two_sided_z(confidence)
    accumulators = accumulate_geometry(model, layers, heldout_batches, reduction=reduction,
                                       check_determinism=check_determinism)
    blocks = {layer: block_for(model, layer, heldout_batches[0], hidden, block_seed) for layer in layers}
    keep = max(budgets)
    train_rows, sums, sizes = _train_pass(model, layers, train_batches, reduction, blocks, keep, groups)
    out = {}
    for layer in layers:
        accumulator = accumulators[layer]
        geometry = accumulator.result(confidence)
        heldout_rows = accumulator.rows().to("cpu", torch.float64)
        if min(len(heldout_rows), len(train_rows[layer])) < keep:
            raise ValueError(f"budget {keep} exceeds the examples given ({len(train_rows[layer])} train, "
                             f"{len(heldout_rows)} held-out); use smaller budgets or more examples")
        values, intervals = _moments(geometry)
        budget_values, budget_intervals = _at_budgets(geometry, intervals["d_align"], train_rows[layer], heldout_rows,
                                                      budgets, z)
        values.update(budget_values)
        intervals.update(budget_intervals)
        norm, lo, hi = _jackknife_norm(sums[layer], sizes, confidence)
        values["grad_norm"], intervals["grad_norm"] = norm, (lo, hi)
        values["random"] = float(torch.rand((), generator=torch.Generator().manual_seed(
            derived_seed("growth-random", random_key, layer))))
        intervals["random"] = (math.nan, math.nan)
        out[layer] = PointStats(layer, values, intervals, geometry)
    return out


def order(values: dict[str, float], name: str) -> list[str]:
    """The points (keys of ``values``) ordered by predictor ``name``, best first (NaN last; ties: given order)."""
    keys = list(values)
    signed = np.array([SIGN(name) * values[k] for k in keys], dtype=float)
    key = np.where(np.isnan(signed), -np.inf, signed)
    return [keys[i] for i in sorted(range(len(keys)), key=lambda i: (-key[i], i))]


def point_rows(measured: dict[str, PointStats], names: Sequence[str]) -> list[dict]:
    """One tidy row per point: each predictor with ``<name>_lo``/``<name>_hi`` and ``rank_<name>`` (1 = grow here)."""
    rows = [{"layer": layer, **{k: v for name in names for k, v in (
        (name, s.values[name]), (f"{name}_lo", s.intervals[name][0]), (f"{name}_hi", s.intervals[name][1]))}}
        for layer, s in measured.items()]
    for name in names:
        ranked = order({r["layer"]: r[name] for r in rows}, name)
        for r in rows:
            r[f"rank_{name}"] = ranked.index(r["layer"]) + 1
    return rows
