"""Where to grow a trained model: do the alignment statistics rank insertion points by the held-out gain?

The paper's motivation is model growth (Net2Net, progressive stacking, LiGO): a method
must decide *where* an expansion still helps on unseen data, and the paper offers
d_align and B_align as the certificate. This module measures, at every candidate
insertion point of a trained model (each residual block's output z), the statistics a
growth method could read off *before* growing, then grows there and measures what
growing actually brought, and scores how well each statistic ranked the points. The
claim tested ("d_align ranks insertion points better than the gradient-norm baseline")
is this project's, not the paper's: the paper certifies the sign of one step at one
point; it does not compare points.

**Predictors** (:func:`predictors`), from one capture per layer on the sweep's pools:

* ``d_align``, ``d_par``, ``d_2``, ``mean_sq`` on the held-out pool, of the family's
  judged q (:attr:`dalign_core.sweep.family.Family.reductions`), by the unbiased Gram
  U-statistics of :mod:`dalign_core.geometry.estimators` with jackknife intervals:
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

**Growing** (:func:`grow`). A zero-output residual block ``z ← z + W₂ σ(W₁ z)``
(:class:`ZeroOutputBlock`: W₂ = 0, W₁ at ``nn.Linear``'s initialization, as
:mod:`dalign_core.studies.interventions.compute` inserts it) is added by a forward hook at the point; only
W₁ and W₂ are trained (Adam, constant rate, the model's own parameters frozen for the
duration and the model in its given mode). Before training the grown model computes the
same function (z + 0 = z bit for bit), so the loss on the evaluation examples before is
the model's own. The realized ``gain`` after s steps is that loss before minus after
(nats; positive = growing there helped). The model is restored bit for bit: hooks
removed, parameters, buffers, ``requires_grad`` and mode as they were.

**Scoring** (:func:`score`). Per model and budget, across its insertion points:

* Spearman's ρ between the signed predictor and the gain, with a Fisher-z interval of
  standard error ``√((1 + ρ²/2)/(n − 3))`` (Bonett and Wright); with n ≤ 3 points the
  interval is [−1, 1];
* ``hit``: whether the point the predictor ranks first has the largest gain;
* ``regret``: the largest gain minus the gain at the predictor's first point (≥ 0).

**Decision** (:func:`decision`), the claim the claims table judges (:data:`CLAIM`): among
models with at least :data:`MIN_POINTS` points whose gains stand above their noise
(:func:`noise`: spread across points ≥ :data:`NOISE_RATIO` standard errors of one point's
gain), the regret of d_align's choice against a random choice (its expectation), the
gradient norm's and fixed rules' (:func:`regrets`), with t intervals over models; both
advantages above 0 ``reproduced``, either below ``contradicted``, else ``inconclusive``,
also when one model left out changes the label. :func:`simulate_decision` runs it on
simulated gains at a given design.

**ρ difference** (:func:`verdict`), shown beside the decision and not judged: per model
``Δ = ρ(d_align) − ρ(grad_norm)``; over models the mean of Δ with its t interval; above 0
``reproduced``, below 0 ``contradicted``, holding 0 ``inconclusive``; fewer than 2 models
with both correlations ``not run``. A baseline that runs backwards makes Δ favour d_align
without d_align beating chance, which is why the decision reads regrets against random.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import stats
from torch import nn

from dalign_core._tensor import derived_seed
from dalign_core.geometry.bounds import b_align
from dalign_core.geometry.estimators import Geometry
from dalign_core.capture.hooks import (
    _gradients,
    _primary,
    _reduce,
    _split_batch,
    _targets_from_labels,
    conform_batch,
    accumulate_geometry,
    check_capturable,
    resolve_layers,
)
from dalign_core.studies.interventions.compute import _added, _feature_dim, _insertion_width, _mean_loss, _ZeroBlock
from dalign_core.sweep.trend import Verdict

__all__ = ["SIGN", "BASE_PREDICTORS", "predictor_names", "ZeroOutputBlock", "inserted", "block_for", "PointStats",
           "predictors", "grow", "spearman", "spearman_interval", "score", "summarize", "verdict", "label_for",
           "CLAIM"]

BASE_PREDICTORS = ("d_align", "d_par", "d_2", "mean_sq", "grad_norm", "random")
"""Predictors that do not depend on a budget (``alignment_M`` and ``b_align_M`` do)."""

CLAIM = "d_align chooses where to grow better than the gradient norm and a random choice"
"""The growth claim the claims table judges (:func:`decision`)."""
RHO_CLAIM = "d_align ranks insertion points better than the gradient-norm baseline"
"""The ρ-difference reading (:func:`verdict`), shown beside the decision."""

CALIBRATION = {"null_reproduced": 0.05, "effect_reproduced": 0.80}
"""What the test suite's simulation of :func:`verdict` at the cpu design's models and insertion points holds it to:
without an effect it says "reproduced" at most ``null_reproduced`` of the time (and "contradicted" as rarely); with
gains that follow d_align about as closely as ρ ≈ 0.5 per model, at least ``effect_reproduced`` of the time."""


def predictor_names(budgets: Sequence[int]) -> list[str]:
    """Every predictor column for the budgets M = K in ``budgets``, in the table's order."""
    return ["d_align", "d_par", "d_2", "mean_sq"] + [f"alignment_{m}" for m in budgets] + \
        [f"b_align_{m}" for m in budgets] + ["grad_norm", "random"]


def SIGN(name: str) -> int:  # noqa: N802  (a table of signs, written as a function of the column name)
    """+1 when a higher value of predictor ``name`` says "grow here", −1 when a lower one does (B_align)."""
    return -1 if name.startswith("b_align") else 1


# ---------------------------------------------------------------------------
# The inserted block


class ZeroOutputBlock(nn.Module):
    """``W₂ σ(W₁ z)`` on the feature axis of z, W₂ = 0 and W₁ as ``nn.Linear`` draws it (no biases), trainable.

    W₁ is the one :mod:`dalign_core.studies.interventions.compute` draws for the same width, hidden size and seed.
    """

    def __init__(self, width: int, hidden: int | None = None, seed: int = 0, dtype=torch.float32, device=None):
        super().__init__()
        drawn = _ZeroBlock(width, hidden or width, torch.Generator().manual_seed(seed))
        self.w1 = nn.Parameter(drawn.w1.to(device=device, dtype=dtype))
        self.w2 = nn.Parameter(drawn.w2.to(device=device, dtype=dtype))

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """σ(W₁ z) with the feature axis last: ``(b, positions…, hidden)``."""
        return torch.nn.functional.gelu(torch.movedim(z, _feature_dim(z), -1) @ self.w1.T)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.movedim(self.features(z) @ self.w2.T, -1, _feature_dim(z))


@contextlib.contextmanager
def inserted(model: nn.Module, layer: str, block: nn.Module) -> Iterator[nn.Module]:
    """While inside, ``layer``'s output z becomes ``z + block(z)`` and only ``block`` can be trained.

    The model's parameters are frozen for the duration (``requires_grad`` restored on exit, also on
    error), so a backward pass runs only from the loss down to the block; the hook is removed on exit.
    """
    (module,) = resolve_layers(model, layer).values()
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        with _added(module, block):
            yield module
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


def block_for(model: nn.Module, layer: str, probe_batch, hidden: int | None = None, seed: int = 0
              ) -> ZeroOutputBlock:
    """The zero-output block for ``layer`` (its width read from one forward pass of ``probe_batch``)."""
    (module,) = resolve_layers(model, layer).values()
    device, dtype = _device_dtype(model)
    width = _insertion_width(model, module, probe_batch, device)
    return ZeroOutputBlock(width, hidden, seed, dtype=dtype, device=device)


# ---------------------------------------------------------------------------
# Predictors


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
                q = torch.movedim(grad, _feature_dim(grad), -1).to(h.dtype)  # (b, positions…, N)
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
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    return estimate, estimate - z * se, estimate + z * se


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
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
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
        values, intervals = {}, {}
        for name in ("d_align", "d_par", "d_2", "mean_sq"):
            values[name] = getattr(geometry, name)
            ci = geometry.intervals.get(name)
            intervals[name] = (ci.lo, ci.hi) if ci is not None else (math.nan, math.nan)
        d_lo, d_hi = intervals["d_align"]
        for m in budgets:
            alignment = float(train_rows[layer][:m].mean(0) @ heldout_rows[:m].mean(0))
            variance = max((2 / m) * geometry.directional + geometry.cov_energy / (m * m), 0.0)
            values[f"alignment_{m}"] = alignment
            intervals[f"alignment_{m}"] = (alignment - z * math.sqrt(variance), alignment + z * math.sqrt(variance))
            at = lambda d: float(b_align(max(d, 0.0), m, m)) if math.isfinite(d) else math.nan  # noqa: E731
            values[f"b_align_{m}"] = at(geometry.d_align)
            intervals[f"b_align_{m}"] = (at(d_hi), at(d_lo))
        norm, lo, hi = _jackknife_norm(sums[layer], sizes, confidence)
        values["grad_norm"], intervals["grad_norm"] = norm, (lo, hi)
        values["random"] = float(torch.rand((), generator=torch.Generator().manual_seed(
            derived_seed("growth-random", random_key, layer))))
        intervals["random"] = (math.nan, math.nan)
        out[layer] = PointStats(layer, values, intervals, geometry)
    return out


# ---------------------------------------------------------------------------
# Growing


def grow(model: nn.Module, layer: str, train_batches: Iterable, eval_batches: list, budgets: Sequence[int], *,
         lr: float, hidden: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Insert a :class:`ZeroOutputBlock` at ``layer``, train only it, and read the loss of ``eval_batches``.

    Args:
        train_batches: an iterable of training batches, at least ``max(budgets)`` of them (one per step).
        eval_batches: the examples whose mean loss is read before training and after each budget.
        budgets: numbers of Adam steps after which the loss is read.
        lr: Adam's (constant) rate; ``seed`` draws W₁.

    Returns:
        ``{"before": loss, "after": {steps: loss}, "gain": {steps: before − after}}`` (nats). The model is
        left exactly as it was.
    """
    budgets = sorted(set(int(b) for b in budgets))
    if not budgets or budgets[0] < 1:
        raise ValueError(f"budgets must be positive numbers of steps, got {budgets}")
    device, _ = _device_dtype(model)
    block = block_for(model, layer, eval_batches[0], hidden, seed)
    optimizer = torch.optim.Adam(block.parameters(), lr=lr)
    after = {}
    with inserted(model, layer, block):
        with torch.no_grad():
            before = float(_mean_loss(model, eval_batches, device))
        batches = iter(train_batches)
        for step in range(1, budgets[-1] + 1):
            try:
                batch = next(batches)
            except StopIteration:
                raise ValueError(f"train_batches ran out after {step - 1} steps; {budgets[-1]} are needed") from None
            with torch.enable_grad():
                loss = _mean_loss(model, [batch], device)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            optimizer.step()
            if step in budgets:
                with torch.no_grad():
                    after[step] = float(_mean_loss(model, eval_batches, device))
    for p in block.parameters():
        p.grad = None
    return {"before": before, "after": after, "gain": {s: before - a for s, a in after.items()}}


# ---------------------------------------------------------------------------
# Scoring


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties; ±inf rank at the ends, NaN points are left out); NaN
    with < 2 points or a constant side."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~np.isnan(x) & ~np.isnan(y)
    x, y = x[keep], y[keep]
    if len(x) < 2:
        return math.nan
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_interval(rho: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Fisher-z interval of Spearman's ρ from n points (Bonett-Wright SE); [−1, 1] with n ≤ 3, NaN for NaN ρ."""
    if not math.isfinite(rho):
        return math.nan, math.nan
    if n <= 3:
        return -1.0, 1.0
    r = min(max(rho, -0.999999), 0.999999)
    se = math.sqrt((1 + r * r / 2) / (n - 3))
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    return math.tanh(math.atanh(r) - z * se), math.tanh(math.atanh(r) + z * se)


MODEL_KEYS = ("family", "dataset", "depth", "model", "width", "seed")
"""Columns that name one trained model (those present in a table)."""


def _model_keys(table: pd.DataFrame) -> list[str]:
    return [k for k in MODEL_KEYS if k in table.columns]


def score(table: pd.DataFrame, names: Sequence[str], confidence: float = 0.95) -> pd.DataFrame:
    """Per model, budget and predictor: ``rho`` with ``rho_lo``/``rho_hi``, ``hit``, ``regret``, ``points``.

    ``table`` has one row per (model, layer, budget_steps) with the predictor columns ``names`` and ``gain``.
    A predictor's first point is the one with the highest signed value (ties: the earlier layer).
    """
    keys = _model_keys(table) + ["budget_steps"]
    out = []
    for key, rows in table.groupby(keys, sort=False, dropna=False):
        rows = rows.reset_index(drop=True)
        gain = rows.gain.to_numpy(dtype=float)
        best = float(np.nanmax(gain)) if np.isfinite(gain).any() else math.nan
        for name in names:
            signed = SIGN(name) * rows[name].to_numpy(dtype=float)
            rho = spearman(signed, gain)
            lo, hi = spearman_interval(rho, int((~np.isnan(signed) & ~np.isnan(gain)).sum()), confidence)
            if (~np.isnan(signed)).any() and np.isfinite(gain).any():
                top = first_choice(signed)
                hit, regret = float(gain[top] == best), best - float(gain[top])
            else:
                hit, regret = math.nan, math.nan
            out.append({**dict(zip(keys, key)), "predictor": name, "points": len(rows), "rho": rho,
                        "rho_lo": lo, "rho_hi": hi, "hit": hit, "regret": regret})
    return pd.DataFrame(out)


def first_choice(signed: np.ndarray) -> int:
    """Index of the largest signed predictor value (+inf counts as largest, NaN as smallest; ties: the first)."""
    signed = np.asarray(signed, dtype=float)
    return int(np.argmax(np.where(np.isnan(signed), -np.inf, signed))) if (~np.isnan(signed)).any() else 0


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


def t_interval(values, confidence: float) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of the finite ``values`` and its Student-t interval (NaN ends below 2 values)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(1 - (1 - confidence) / 2, len(values) - 1)) * float(values.std(ddof=1)) / \
        math.sqrt(len(values))
    return mean, mean - half, mean + half


def summarize(scores: pd.DataFrame, by: Sequence[str] = ("family", "budget_steps"), confidence: float = 0.95
              ) -> pd.DataFrame:
    """Mean ρ, hit rate and regret per predictor (and ``by``) over models, each with a t interval over models."""
    rows = []
    for key, part in scores.groupby(list(by) + ["predictor"], sort=False):
        row = dict(zip(list(by) + ["predictor"], key), models=int(part.rho.notna().sum()))
        for column in ("rho", "hit", "regret"):
            mean, lo, hi = t_interval(part[column].to_numpy(dtype=float), confidence)
            row.update({column: mean, f"{column}_lo": lo, f"{column}_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def label_for(lo: float, hi: float) -> str:
    """``reproduced`` above 0, ``contradicted`` below 0, ``inconclusive`` holding 0, ``not run`` without one."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "not run"
    return "reproduced" if lo > 0 else "contradicted" if hi < 0 else "inconclusive"


def verdict(scores: pd.DataFrame, budget: int | None = None, family: str | None = None, *,
            predictor: str = "d_align", baseline: str = "grad_norm", confidence: float = 0.95) -> Verdict:
    """Judge "``predictor`` ranks insertion points better than ``baseline``" from :func:`score`'s rows.

    Per model Δ = ρ(predictor) − ρ(baseline); the verdict reads the t interval of the mean Δ over models
    (:func:`label_for`). ``budget`` and ``family`` select rows (None: the largest budget; every family).
    ``slope``/``slope_lo``/``slope_hi`` of the returned :class:`~dalign_core.sweep.trend.Verdict` hold mean Δ and its
    interval.
    """
    claim = RHO_CLAIM if (predictor, baseline) == ("d_align", "grad_norm") else \
        f"{predictor} ranks insertion points better than {baseline}"
    where = f" ({family})" if family else ""
    if scores.empty:
        return Verdict(claim, "not run", f"{claim}{where}: not run at this profile (no grown model).")
    rows = scores if family is None else scores[scores.family == family]
    if budget is None and len(rows):
        budget = int(rows.budget_steps.max())
    rows = rows[rows.budget_steps == budget]
    keys = [k for k in _model_keys(rows)]
    wide = rows.pivot_table(index=keys, columns="predictor", values="rho", dropna=False) if len(rows) else None
    if wide is None or predictor not in wide or baseline not in wide:
        return Verdict(claim, "not run", f"{claim}{where}: not run at this profile (no grown model).")
    delta = (wide[predictor] - wide[baseline]).to_numpy(dtype=float)
    models = int(np.isfinite(delta).sum())
    mean, lo, hi = t_interval(delta, confidence)
    label = label_for(lo, hi) if models >= 2 else "not run"
    if label == "not run":
        return Verdict(claim, "not run", f"{claim}{where}: not run ({models} model(s) with both correlations at "
                                         f"{budget} steps; at least 2 are needed).")
    reading = {"reproduced": f"{predictor} ranks the points by their gain better than {baseline} does",
               "contradicted": f"{baseline} ranks the points by their gain better than {predictor} does",
               "inconclusive": "the interval holds 0: these models cannot tell the two rankings apart"}[label]
    pct = f"{confidence * 100:g}%"
    sentence = (f"{claim}{where}: {label}. Over {models} models grown for {budget} steps, Spearman's ρ between "
                f"{predictor} and the realized held-out gain minus that of {baseline} is {mean:+.2f} on average "
                f"({pct} interval [{lo:+.2f}, {hi:+.2f}]): {reading}.")
    return Verdict(claim, label, sentence, mean, lo, hi)


def seeded_batches(make: Callable[[torch.Tensor], Any], n: int, batch_size: int, seed: Any) -> Iterator:
    """An endless stream of batches ``make(indices)`` of ``batch_size`` random examples of ``n``, seeded by ``seed``."""
    generator = torch.Generator().manual_seed(derived_seed("growth-batches", seed))
    while True:
        yield make(torch.randint(0, n, (batch_size,), generator=generator))


__all__ += ["seeded_batches", "MODEL_KEYS", "first_choice", "order", "point_rows"]


# ---------------------------------------------------------------------------
# The decision: does choosing the top point by d_align lose less than the baselines?

DECISION_CLAIM = CLAIM
MIN_POINTS = 4
"""Insertion points a model needs for its choice to be a ranking (with 2, any order is a coin flip)."""
NOISE_RATIO = 2.0
"""A model's points are told apart when the spread of their gains is at least this many standard errors of one
point's gain (SE ≤ half the spread)."""
FIXED_RULES = ("first", "middle", "last")
"""Choices that read no statistic: always the first, the middle or the last insertion point of the model."""


def noise(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Per model and budget: ``points``, ``spread`` (SD of the gain across points, nats), ``se`` (root mean square
    over points of one point's standard error, from its t interval over ``repeats``) and ``ratio`` = spread / se;
    ``told_apart`` when the ratio reaches :data:`NOISE_RATIO` and there are :data:`MIN_POINTS` points."""
    keys = _model_keys(table) + ["budget_steps"]
    rows = []
    for key, part in table.groupby(keys, sort=False, dropna=False):
        repeats = int(part.repeats.iloc[0]) if "repeats" in part else 0
        quantile = float(stats.t.ppf(1 - (1 - confidence) / 2, repeats - 1)) if repeats > 1 else math.nan
        se_points = (part.gain_hi - part.gain_lo) / (2 * quantile)
        se = float(np.sqrt(np.nanmean(se_points.to_numpy(float) ** 2))) if repeats > 1 else math.nan
        spread = float(part.gain.std(ddof=1)) if len(part) > 1 else math.nan
        ratio = spread / se if se and math.isfinite(se) else math.nan
        rows.append({**dict(zip(keys, key)), "points": int(part.layer.nunique()), "repeats": repeats,
                     "spread": spread, "se": se, "ratio": ratio,
                     "told_apart": bool(ratio >= NOISE_RATIO and part.layer.nunique() >= MIN_POINTS)})
    return pd.DataFrame(rows)


def regrets(table: pd.DataFrame, names: Sequence[str] = ("d_align", "grad_norm")) -> pd.DataFrame:
    """Per model and budget, the regret (nats: the best point's gain minus the chosen one's) of choosing by each
    predictor of ``names``, of a random choice (its expectation: best minus the mean gain over points) and of each
    fixed rule of :data:`FIXED_RULES` (by ``layer_index``, else the table's order). One column per choice."""
    keys = _model_keys(table) + ["budget_steps"]
    rows = []
    for key, part in table.groupby(keys, sort=False, dropna=False):
        part = part.sort_values("layer_index") if "layer_index" in part else part
        gain = part.gain.to_numpy(float)
        if not np.isfinite(gain).any():
            continue
        best = float(np.nanmax(gain))
        row = {**dict(zip(keys, key)), "points": len(part), "random": best - float(np.nanmean(gain))}
        for name in names:
            row[name] = best - float(gain[first_choice(SIGN(name) * part[name].to_numpy(float))])
        for rule, index in zip(FIXED_RULES, (0, len(part) // 2, len(part) - 1)):
            row[rule] = best - float(gain[index])
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Decision:
    """The growth decision judged for one family (or all) at one budget."""

    label: str
    reason: str
    models: int
    """Models judged (at least :data:`MIN_POINTS` points and their gains told apart)."""
    of: int
    """Models grown."""
    regret: dict
    """choice → (mean regret over the judged models, lo, hi), nats."""
    advantage: dict
    """baseline → (mean of baseline's regret − d_align's, lo, hi): positive = d_align loses less."""
    best_fixed: str = ""
    leave_one_out: tuple = (math.nan, math.nan)
    """Range of the smaller advantage's lower end with each judged model left out."""
    ratios: tuple = ()
    """(model name, spread/SE) of every grown model."""

    def sentence(self, where: str = "") -> str:
        """The verdict in one generated sentence (numbers in nats)."""
        if not self.regret:
            return f"{DECISION_CLAIM}{where}: **{self.label}** ({self.reason})."
        parts = ", ".join(f"{name.replace('_', ' ')} {m:.2g} [{lo:.2g}, {hi:.2g}]" for name, (m, lo, hi) in
                          self.regret.items())
        return (f"{DECISION_CLAIM}{where}: **{self.label}** ({self.reason}). Mean regret over {self.models} of "
                f"{self.of} models (nats, 95% t interval): {parts}; best fixed rule: {self.best_fixed}; "
                f"leave-one-out range of the smaller advantage's lower end [{self.leave_one_out[0]:.2g}, "
                f"{self.leave_one_out[1]:.2g}].")


def _decide(wide: pd.DataFrame, confidence: float) -> tuple[str, str, dict]:
    advantage = {base: t_interval((wide[base] - wide["d_align"]).to_numpy(float), confidence)
                 for base in ("random", "grad_norm")}
    lows = [advantage[b][1] for b in advantage]
    highs = [advantage[b][2] for b in advantage]
    if not all(math.isfinite(v) for v in lows + highs):
        return "not estimable", "fewer than 2 models judged", advantage
    if min(lows) > 0:
        return "reproduced", "d_align's regret lies below both random's and the gradient norm's", advantage
    if min(highs) < 0:
        worse = [b.replace("_", " ") for b in advantage if advantage[b][2] < 0]
        return "contradicted", f"d_align's regret lies above {' and '.join(worse)}'s", advantage
    return "inconclusive", "an interval of d_align's advantage holds 0", advantage


def decision(table: pd.DataFrame, budget: int | None = None, family: str | None = None,
             confidence: float = 0.95) -> Decision:
    """Judge :data:`DECISION_CLAIM` from a growth table (rows per model, point and budget).

    Models with fewer than :data:`MIN_POINTS` points, or whose gains are not told apart (:func:`noise`), are left
    out; with fewer than 2 left the label is ``not estimable`` (too few points) or ``inconclusive`` (the gains are
    below their noise), with the reason. Otherwise, per model, the regrets of :func:`regrets`; the advantage over a
    baseline is its regret minus d_align's, with a t interval over models. ``reproduced`` when both advantages (over
    random and over the gradient norm) lie above 0, ``contradicted`` when either lies below 0, else
    ``inconclusive``; and ``inconclusive`` when leaving out any one model changes the label (fragile)."""
    rows = table if family is None else table[table.family == family]
    if rows.empty:
        return Decision("not run", "no grown model", 0, 0, {}, {})
    budget = int(rows.budget_steps.max()) if budget is None else budget
    rows = rows[rows.budget_steps == budget]
    told = noise(rows, confidence)
    ratios = tuple((f"{r.model} s{r.seed}", float(r.ratio)) for r in told.itertuples())
    of = len(told)
    enough = told[told.points >= MIN_POINTS]
    judged = enough[enough.told_apart]
    if len(enough) < 2:
        return Decision("not estimable", f"{int(told.points.max()) if of else 0} insertion points per model: at least "
                        f"{MIN_POINTS} are needed for a choice to be a ranking", 0, of, {}, {}, ratios=ratios)
    if len(judged) < max(2, math.ceil(len(enough) / 2)):  # a design whose points most models cannot tell apart
        return Decision("inconclusive", f"the gains are below their noise: spread/SE across points has median "
                        f"{float(enough.ratio.median()):.2f} (at least {NOISE_RATIO:g} needed; {len(judged)} of "
                        f"{len(enough)} models reach it), so the experiment cannot tell the points apart",
                        0, of, {}, {}, ratios=ratios)
    label_of = lambda frame: ["|".join(map(str, v)) for v in zip(*(frame[k] for k in _model_keys(rows)))]  # noqa: E731
    chosen = rows[np.isin(label_of(rows), label_of(judged))]
    wide = regrets(chosen)
    regret = {name: t_interval(wide[name].to_numpy(float), confidence)
              for name in ("d_align", "grad_norm", "random", *FIXED_RULES)}
    best_fixed = min(FIXED_RULES, key=lambda rule: regret[rule][0])
    label, reason, advantage = _decide(wide, confidence)
    shown = {name: regret[name] for name in ("d_align", "grad_norm", "random")}
    shown[f"always {best_fixed}"] = regret[best_fixed]
    left = []
    for i in range(len(wide)):
        others = wide.drop(index=wide.index[i])
        if len(others) < 2:
            continue
        l_label, _, l_adv = _decide(others, confidence)
        left.append((l_label, min(l_adv[b][1] for b in l_adv)))
    span = (min(v for _, v in left), max(v for _, v in left)) if left else (math.nan, math.nan)
    if any(l_label != label for l_label, _ in left):
        changed = sorted({l_label for l_label, _ in left if l_label != label})
        reason = f"{reason}, but leaving out one model turns it {' or '.join(changed)}"
        label = "inconclusive"
    return Decision(label, reason, len(wide), of, shown, advantage, best_fixed, span, ratios)


def simulate_decision(points: Sequence[int], effect: float, ratio: float = 3.0, repeats: int = 2, trials: int = 200,
                      seed: int = 0, confidence: float = 0.95, backwards: float = 0.0) -> dict[str, float]:
    """How often :func:`decision` gives each label for models with ``points`` insertion points each, when the true
    gains follow d_align with weight ``effect`` (0: unrelated to d_align) and run against the gradient norm with
    weight ``backwards`` (a baseline worse than random), and each point's gain is measured over ``repeats`` growths
    with a standard error of the spread across points / ``ratio``."""
    rng = np.random.default_rng(seed)
    found = []
    quantile = float(stats.t.ppf(1 - (1 - confidence) / 2, repeats - 1))
    for _ in range(trials):
        rows = []
        for m, n in enumerate(points):
            d, g = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
            true = (effect * (d - d.mean()) / d.std() - backwards * (g - g.mean()) / g.std()
                    + (1 - effect - backwards) * rng.normal(size=n))
            true = true / true.std()
            for i in range(n):
                draws = true[i] + rng.normal(scale=math.sqrt(repeats) / ratio, size=repeats)
                mean, sd = draws.mean(), draws.std(ddof=1)
                half = quantile * sd / math.sqrt(repeats)
                rows.append(dict(family="toy", model=f"m{m}", seed=0, layer=f"l{i}", layer_index=i, d_align=d[i],
                                 grad_norm=g[i], budget_steps=1, gain=mean, gain_lo=mean - half,
                                 gain_hi=mean + half, repeats=repeats))
        found.append(decision(pd.DataFrame(rows), confidence=confidence).label)
    return {label: found.count(label) / trials for label in sorted(set(found))}


__all__ += ["DECISION_CLAIM", "MIN_POINTS", "NOISE_RATIO", "FIXED_RULES", "noise", "regrets", "Decision",
            "decision", "simulate_decision"]
