"""Is the activation gradient at an insertion point already a trained parameter's gradient?

q(x) = ∇_z ℓ at the output z of a module (captured as :mod:`dalign_core.capture.hooks` does).
If a trained parameter θ enters the forward pass as ``z ← z + θ`` at every position,
then ∇_θ ℓ = Σ_positions ∇_z ℓ: the *shared* q is θ's per-example gradient (Pythia:
``gpt_neox.layers.l`` ends with ``mlp.dense_4h_to_h.bias``). More generally, if
q_i = A g_i for the per-example gradients g_i of trained parameters and a fixed map A
(ResNet: the shared q at a block output is, up to border effects of the padded
convolutions, a linear map of the next block's BatchNorm-bias gradients), then

    μ_q = E q = A E g = A ∇_θ L,

and training drives ∇_θ L, hence ‖μ_q‖², to zero at any width: d_align at such a
point measures the optimizer's convergence, not width. This module measures how much
of q such parameters already own.

Method. For n examples, one forward pass per micro-batch (``MICRO_BATCH`` rows of a batch:
a backward pass costs as much as the graph it runs through) and one backward pass per
example give q_i (n × d, the requested reduction) and the candidates' gradients g_i (n × P).
A random ``fit_fraction`` of the examples fits a ridge regression without intercept
(a *linear* map, so that μ_q = A μ_g carries over), W = argmin ‖Q − G W‖² + λ‖W‖²,
on columns scaled to unit RMS with λ = ``ridge`` · tr(GᵀG)/P (by default the ridge of
``RIDGES`` that two-fold cross-validation on the fit examples prefers: small for an
exact linear relation, larger when few examples would overfit); on the other examples

* ``variance_explained`` = 1 − Σ‖q_i − W g_i‖² / Σ‖q_i − q̄‖² (held-out R², clipped at 0),
* ``mean_explained`` = 1 − ‖q̄ − mean_i W g_i‖² / ‖q̄‖² (clipped at 0).

``exact`` names a candidate whose gradient equals q for every example to a relative
Frobenius difference ≤ 1e-5 (a few ulps for half precision). A held-out fit needs
fewer coordinates than fitting examples: when the candidates have more than
``n_fit // 2`` coordinates, whole candidates are taken in order of their own held-out
share (``shares``, each fitted alone on at most that many coordinates) until the
budget is spent, the last one as a seeded subset of its coordinates. That is a lower
bound on what all of them explain (up to the mild optimism of ranking the few
candidates on the evaluation examples), and the result says so in ``note``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from dalign_core.capture.batches import (
    batch_rows,
    check_batch,
    check_batches,
    device_of,
    conform_batch,
    split_batch,
    targets_from_labels,
)
from dalign_core.capture.gradients import forward_to_losses
from dalign_core.capture.hooks import REDUCTIONS, check_options, reduce_gradient
from dalign_core.capture.layers import insertion_points, resolve_layers
from dalign_core.capture.losses import LossFn
from dalign_core.capture.refusals import CaptureError, check_capturable

__all__ = ["REDUNDANT", "EXACT_RTOL", "MICRO_BATCH", "RIDGES", "Redundancy", "candidate_parameters", "redundancy",
           "redundancy_rows"]

REDUNDANT = 0.9
"""A q with :attr:`Redundancy.fraction` above this is owned by trained parameters: its d_align says little."""
RIDGES = (1e-6, 1e-4, 1e-2, 1e-1, 1.0)
"""Relative ridges tried by :func:`redundancy` with ``ridge=None`` (two-fold cross-validation on the fit examples)."""
EXACT_RTOL = 1e-5
"""Relative Frobenius difference below which a candidate's gradient *is* q (float32 precision)."""
MICRO_BATCH = 4
"""Rows per forward pass of the per-example gradients. Measured on the committed cpu models (2026-12-02, 64 to 128
held-out examples, one thread): 4 rows give rows bit for bit those of the whole capture batch, at 1/16 of the time
for LLaMA N = 256 (65 against 1,032 ms an example, batches of 64) and 1/13 for ResNet-20 k = 1.5 (10 against
133 ms, batches of 128); 2 and 1 rows take other kernel paths on ResNet-20 (8e-8 and 2e-5 relative)."""


@dataclass(frozen=True)
class Redundancy:
    """How much of q at ``layer`` (``reduction``) the candidates' per-example gradients explain.

    ``shares`` maps each candidate to its own held-out R²; ``coordinates`` of the
    ``candidate_coordinates`` were fitted (fewer when subsampled, see ``note``);
    ``n`` examples of dimension ``d``, ``n_fit`` of them fitted, the rest evaluated.
    """

    layer: str
    reduction: str
    variance_explained: float
    mean_explained: float
    exact: str | None
    n: int
    n_fit: int
    d: int
    coordinates: int
    candidate_coordinates: int
    shares: dict[str, float] = field(default_factory=dict)
    exact_all: tuple[str, ...] = ()
    note: str = ""

    @property
    def fraction(self) -> float:
        """``max(variance_explained, 1 if exact else 0)``: the share of q already owned by trained parameters."""
        return max(self.variance_explained, 1.0 if self.exact else 0.0)

    @property
    def owner(self) -> str | None:
        """The exact candidate, else the one explaining most of q on its own (None without candidates)."""
        if self.exact:
            return self.exact
        return max(self.shares, key=lambda k: self.shares[k]) if self.shares else None

    @property
    def redundant(self) -> bool:
        return self.fraction > REDUNDANT

    def to_row(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k not in ("shares", "exact_all")}
        row.update(fraction=self.fraction, owner=self.owner)
        return row


# ---------------------------------------------------------------------------
# Candidates


def _following(model: nn.Module, layer: str) -> str | None:
    """The module that follows ``layer``: the next residual block, else the next sibling in its parent, else the
    first normalization module after it (a final norm such as ``model.norm``)."""
    try:
        points = insertion_points(model)
    except CaptureError:
        points = []
    if layer in points[:-1]:
        return points[points.index(layer) + 1]
    modules = dict(model.named_modules())
    parent, _, child = layer.rpartition(".")
    if layer not in points:
        siblings = [name for name, _ in modules[parent].named_children()]
        if child in siblings[:-1]:
            following = siblings[siblings.index(child) + 1]
            return f"{parent}.{following}" if parent else following
    names = list(modules)
    after = [n for n in names[names.index(layer) + 1:] if not n.startswith(layer + ".")]
    return next((n for n in after if "Norm" in type(modules[n]).__name__), None)


def candidate_parameters(model: nn.Module, layer: str) -> list[str]:
    """Names of the trained 1-D parameters (biases, norm scales and shifts) of ``layer`` and of the module that
    follows it (the next residual block; for the last block the final norm, if found), in registration order."""
    resolve_layers(model, layer)
    prefixes = [layer] + [p for p in [_following(model, layer)] if p]
    return [name for name, p in model.named_parameters()
            if p.ndim == 1 and p.requires_grad and any(name.startswith(pre + ".") for pre in prefixes)]


def _check_parameters(model: nn.Module, names: Any) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
        raise CaptureError(f"parameters must be a list of parameter names, got {type(names).__name__}")
    names = list(names)
    named = dict(model.named_parameters())
    for name in names:
        if name not in named:
            near = difflib.get_close_matches(name, list(named), n=5, cutoff=0.3)
            raise CaptureError(f"{type(model).__name__} has no parameter named {name!r}"
                               + (f"; nearest names: {', '.join(near)}" if near else "")
                               + ". Names are as printed by model.named_parameters().")
        if not named[name].requires_grad:
            raise CaptureError(f"parameter {name!r} is frozen (requires_grad=False): it is not trained, so it owns "
                               "no direction of q; leave it out")
    if not names:
        raise CaptureError("no candidate parameters: name at least one with parameters=")
    return names


# ---------------------------------------------------------------------------
# Per-example gradients


def _collect(model, layers: list[str], names: list[str], batches, reductions, task, loss_fn, examples,
             micro_batch: int | None = None):
    """q rows per (layer, reduction) and gradient rows per name: one forward per micro-batch, one backward per example.

    A per-example backward pass runs through the whole forward graph it starts from, so its cost grows with the
    rows that graph holds: slicing each batch into ``micro_batch`` rows (``None``: the whole batch) makes the n
    backward passes cost n micro-batch backwards rather than n batch backwards. A per-example gradient does not
    depend on the other rows of an eval-mode forward, so the rows agree with the whole batch's to rounding.
    """
    modules = resolve_layers(model, layers)
    check_capturable(model)
    named = dict(model.named_parameters())
    params = [named[n] for n in names]
    device = device_of(model)
    qs = {(l, r): [] for l in modules for r in reductions}
    gs: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    gathering = _Gathering(model, modules, params, names, tuple(reductions), task, loss_fn, qs, gs)
    seen = 0
    for batch in batches:
        if examples is not None and seen >= examples:
            break
        inputs, targets = split_batch(batch)
        targets = targets_from_labels(inputs, targets)
        check_batch(model, inputs, targets, loss_fn)
        inputs, targets = conform_batch(model, inputs, targets, device)
        size = _batch_size(inputs, targets)
        step = size if micro_batch is None else micro_batch
        for start in range(0, size, step):
            if examples is not None and seen >= examples:
                break
            rows = slice(start, start + step)
            seen += _per_example(gathering, batch_rows(inputs, size, rows), batch_rows(targets, size, rows),
                                 None if examples is None else examples - seen)
    if seen < 4:
        raise CaptureError(f"the batches hold {seen} example(s); the held-out fit needs at least 4")

    def stack(rows):  # full q of shorter (padded) batches: zeros at the missing positions, as padding gives
        width = max(r.numel() for r in rows)
        return torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows])

    return {k: stack(v) for k, v in qs.items()}, {k: torch.stack(v) for k, v in gs.items()}, \
        {n: params[i].dtype for i, n in enumerate(names)}


def _batch_size(inputs: Any, targets: Any) -> int:
    """The leading dimension of the batch's first tensor (the targets', or the inputs' when they are a mapping)."""
    for value in (targets, inputs, *(inputs.values() if isinstance(inputs, dict) else ())):
        if isinstance(value, torch.Tensor) and value.ndim:
            return value.shape[0]
    raise CaptureError("cannot tell the batch size: neither the inputs nor the targets are batch-first tensors")


@dataclass(frozen=True)
class _Gathering:
    """What :func:`_collect`'s per-example passes read (the model, its layers and candidate parameters, the
    reductions and the loss) and fill: q rows per (layer, reduction) in ``qs``, gradient rows per name in ``gs``."""

    model: nn.Module
    modules: dict[str, nn.Module]
    params: list[torch.Tensor]
    names: list[str]
    reductions: tuple[str, ...]
    task: str
    loss_fn: LossFn | None
    qs: dict[tuple[str, str], list[torch.Tensor]]
    gs: dict[str, list[torch.Tensor]]


def _per_example(gathering: _Gathering, inputs, targets, limit: int | None) -> int:
    """One forward of ``inputs`` (with the capture's refusals: :func:`~dalign_core.capture.gradients.forward_to_losses`), then
    one backward per example (at most ``limit``): appends their q and gradient rows to ``gathering``'s; returns
    how many examples it took."""
    g = gathering
    # only the candidates record a graph below the layers
    zs, losses = forward_to_losses(g.model, g.modules, inputs, targets, g.task, g.loss_fn, keep=g.params)
    take = losses.shape[0] if limit is None else min(losses.shape[0], limit)
    for i in range(take):
        grads = torch.autograd.grad(losses[i], zs + g.params, retain_graph=i < take - 1, allow_unused=True,
                                    materialize_grads=True)
        for layer, grad in zip(g.modules, grads[:len(zs)]):
            for r in g.reductions:
                g.qs[layer, r].append(reduce_gradient(grad[i:i + 1].detach(), r)[0].to("cpu", torch.float64))
        for name, grad in zip(g.names, grads[len(zs):]):
            g.gs[name].append(grad.detach().reshape(-1).to("cpu", torch.float64))
    return take


# ---------------------------------------------------------------------------
# Fit


def _ridge_map(G: torch.Tensor, Q: torch.Tensor, ridge: float) -> torch.Tensor:
    """W (P × d) minimizing ‖Q − G W‖² + λ‖W‖², λ = ``ridge`` · tr(GᵀG)/P."""
    A = G.T @ G
    lam = ridge * float(torch.trace(A)) / max(A.shape[0], 1) + 1e-300
    return torch.linalg.solve(A + lam * torch.eye(A.shape[0], dtype=A.dtype, device=A.device), G.T @ Q)


def _r2(truth: torch.Tensor, pred: torch.Tensor) -> float:
    total = float((truth - truth.mean(0)).pow(2).sum())
    return 1 - float((truth - pred).pow(2).sum()) / total if total > 0 else math.nan


def _held_out(Q: torch.Tensor, G: torch.Tensor, fit: torch.Tensor, ev: torch.Tensor, ridge: float | None):
    """(held-out R², mean explained) of the ridge map fitted on rows ``fit`` of G (n × P) to Q (n × d).

    Columns are scaled to unit RMS on the fit rows; ``ridge=None`` picks λ from :data:`RIDGES` by two-fold
    cross-validation on the fit rows alone, so the evaluation rows stay unseen.
    """
    scale = G[fit].pow(2).mean(0).sqrt()
    Gs = G / torch.where(scale > 0, scale, torch.ones_like(scale))
    if ridge is None:
        half = len(fit) // 2
        folds = ((fit[:half], fit[half:]), (fit[half:], fit[:half]))
        ridge = max(RIDGES, key=lambda r: sum(
            _r2(Q[b], Gs[b] @ _ridge_map(Gs[a], Q[a], r)) for a, b in folds))
    pred, truth = Gs[ev] @ _ridge_map(Gs[fit], Q[fit], ridge), Q[ev]
    mu = truth.mean(0)
    mean_sq = float(mu.pow(2).sum())
    mean = 1 - float((mu - pred.mean(0)).pow(2).sum()) / mean_sq if mean_sq > 0 else math.nan
    return max(_r2(truth, pred), 0.0), max(mean, 0.0)


def _columns(width: int, limit: int, seed: int) -> torch.Tensor | None:
    if width <= limit:
        return None
    return torch.randperm(width, generator=torch.Generator().manual_seed(seed))[:limit].sort().values


def _assess(layer, reduction, Q, gs, dtypes, fit, ev, ridge, seed) -> Redundancy:
    limit = max(1, len(fit) // 2)
    names = list(gs)
    shares = {}
    for name in names:
        cols = _columns(gs[name].shape[1], limit, seed)
        shares[name] = _held_out(Q, gs[name] if cols is None else gs[name][:, cols], fit, ev, ridge)[0]
    total = sum(gs[n].shape[1] for n in names)
    blocks, budget = [], limit
    for name in sorted(names, key=lambda k: -shares[k]):  # whole candidates, best first, while they fit
        cols = _columns(gs[name].shape[1], budget, seed)
        blocks.append(gs[name] if cols is None else gs[name][:, cols])
        budget -= blocks[-1].shape[1]
        if budget <= 0:
            break
    G = torch.cat(blocks, dim=1)
    note = "" if G.shape[1] == total else (
        f"fitted {G.shape[1]} of {total} candidate coordinates (whole candidates in order of their own share, "
        "then a seeded subset; a lower bound): use more examples for all")
    variance, mean = _held_out(Q, G, fit, ev, ridge)
    norm = float(Q.norm())
    exact_all = tuple(
        n for n in names if gs[n].shape == Q.shape and norm > 0
        and float((gs[n] - Q).norm()) <= max(EXACT_RTOL, 4 * torch.finfo(dtypes[n]).eps) * norm)
    return Redundancy(layer=layer, reduction=reduction, variance_explained=variance, mean_explained=mean,
                      exact=exact_all[-1] if exact_all else None, n=Q.shape[0], n_fit=len(fit), d=Q.shape[1],
                      coordinates=G.shape[1], candidate_coordinates=total, shares=shares,
                      exact_all=exact_all, note=note)


@dataclass(frozen=True)
class _Options:
    """The redundancy check's options beside the model, layers, batches and reductions (see :func:`redundancy`)."""

    parameters: Sequence[str] | None = None
    task: str = "auto"
    loss_fn: LossFn | None = None
    fit_fraction: float = 0.5
    ridge: float | None = None
    seed: int = 0
    examples: int | None = None
    device: Any = None
    micro_batch: int | None = MICRO_BATCH

    def check(self) -> None:
        """Raise CaptureError naming the first option out of its range."""
        if not 0 < self.fit_fraction < 1:
            raise CaptureError(f"fit_fraction must lie strictly between 0 and 1, got {self.fit_fraction}")
        if self.ridge is not None and not self.ridge > 0:
            raise CaptureError(f"ridge must be positive, got {self.ridge}")
        if self.examples is not None and (not isinstance(self.examples, int) or self.examples < 4):
            raise CaptureError(f"examples must be an int of at least 4 or None, got {self.examples!r}")
        micro_batch = self.micro_batch
        if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int)
                                        or micro_batch < 1):
            raise CaptureError(f"micro_batch must be a positive int or None (the whole batch), got {micro_batch!r}")


def _candidates(model, layers: list[str], parameters: Sequence[str] | None) -> dict[str, list[str]]:
    """Each layer's candidate parameter names (``parameters``, checked, or :func:`candidate_parameters`); raises
    where a layer has none."""
    own = {l: (_check_parameters(model, parameters) if parameters is not None else candidate_parameters(model, l))
           for l in layers}
    for l, names in own.items():
        if not names:
            raise CaptureError(f"{l!r} and the module after it have no trained 1-D parameters to test; "
                               "name candidates with parameters=")
    return own


def _fit_split(n: int, fit_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded split of ``n`` examples into fit rows (``fit_fraction`` of them, at least 2, leaving at least 2)
    and evaluation rows, each sorted."""
    n_fit = min(max(2, round(fit_fraction * n)), n - 2)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[:n_fit].sort().values, order[n_fit:].sort().values


def _redundancies(model, layers, batches, reductions, options: _Options) -> list[Redundancy]:
    """:class:`Redundancy` of every layer and reduction, from one pass over ``batches``."""
    check_batches(batches)
    layers = list(resolve_layers(model, layers))
    for r in reductions:
        check_options(r, options.task, options.loss_fn)
    options.check()
    own = _candidates(model, layers, options.parameters)
    names = list(dict.fromkeys(n for l in layers for n in own[l]))
    qs, gs, dtypes = _collect(model, layers, names, batches, reductions, options.task, options.loss_fn,
                              options.examples, options.micro_batch)
    if options.device is not None:
        qs = {k: v.to(options.device) for k, v in qs.items()}
        gs = {k: v.to(options.device) for k, v in gs.items()}
    fit, ev = _fit_split(next(iter(gs.values())).shape[0], options.fit_fraction, options.seed)
    return [_assess(l, r, qs[l, r], {k: gs[k] for k in own[l]}, dtypes, fit, ev, options.ridge, options.seed)
            for l in layers for r in reductions]


def redundancy(model: nn.Module, layer: str, batches: Iterable[Any], *, reduction: str = "shared",
               parameters: Sequence[str] | None = None, task: str = "auto", loss_fn: LossFn | None = None,
               fit_fraction: float = 0.5, ridge: float | None = None, seed: int = 0, device=None,
               examples: int | None = None, micro_batch: int | None = MICRO_BATCH) -> Redundancy:
    """How much of q at ``layer`` the per-example gradients of trained parameters already explain.

    Args:
        model, layer, batches, task, loss_fn: as for :func:`dalign_core.capture.hooks.iter_activation_gradients`;
            q_i has shape ``(d,)`` (N or C for ``"shared"``, T·N or C·H·W for ``"full"``).
        parameters: candidate parameter names (default :func:`candidate_parameters`); each
            contributes its flattened per-example gradient, P coordinates in all.
        fit_fraction: share of the n examples (a seeded random subset) that fits the map; the rest evaluate it.
        ridge: relative ridge λ / (mean eigenvalue of GᵀG) on unit-RMS columns; None (default) picks one of
            ``RIDGES`` by two-fold cross-validation on the fit examples.
        device: where the fit runs, in float64 (default: the CPU); the model runs on its own device.
        examples: use at most this many examples of ``batches``.
        micro_batch: rows of a batch that one forward pass takes (``None``: the whole batch). Each example needs a
            backward pass of its own, which costs as much as the forward graph it runs through: rows taken
            ``micro_batch`` at a time cost n small backwards instead of n whole-batch ones (:data:`MICRO_BATCH`).

    Returns:
        A :class:`Redundancy`; ``fraction > REDUNDANT`` means q's mean is a trained parameter's gradient mean.

    Raises:
        CaptureError: unknown layer or parameter, a frozen candidate, fewer than 4 examples, the capture's refusals.
    """
    options = _Options(parameters=parameters, task=task, loss_fn=loss_fn, fit_fraction=fit_fraction, ridge=ridge,
                       seed=seed, examples=examples, device=device, micro_batch=micro_batch)
    return _redundancies(model, [layer], batches, (reduction,), options)[0]


def redundancy_rows(model: nn.Module, layers: str | Sequence[str], batches: Iterable[Any],
                    reductions: Sequence[str] = ("shared", "full"), **kw) -> list[dict]:
    """Tidy rows (layer, reduction, variance_explained, mean_explained, exact, fraction, owner, n, d, …) for tables.

    One pass over ``batches`` serves every layer and reduction (``batches`` may be a one-shot iterator);
    ``layers`` is a name, a list or ``"all"``; ``kw`` as for :func:`redundancy`.
    """
    unknown = set(kw) - {"device", "parameters", "task", "loss_fn", "fit_fraction", "ridge", "seed", "examples",
                         "micro_batch"}
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}")
    if isinstance(reductions, str) or not set(reductions) <= set(REDUCTIONS):
        raise CaptureError(f"reductions must be a list drawn from {REDUCTIONS}, got {reductions!r}")
    return [r.to_row() for r in _redundancies(model, layers, batches, tuple(reductions), _Options(**kw))]
