"""Residual interventions: does the alignment statistic predict the true held-out loss change?

Insert a zero-initialized residual parameter at an insertion point ``z`` of a trained
model, take one small step along the *train*-mean direction, and measure how the
*held-out* loss actually moves. Two insertions:

**Shared bias.** ``z ← z + b`` with one bias ``b ∈ R^N`` shared over positions (tokens,
or the pixels of a feature map; the ``shared`` reduction of :mod:`dalign_core.capture.hooks`),
so ``∂ℓ_i/∂b = q_i``. With ``μ_M`` the mean q of M training examples and ``g_K`` that of
K held-out examples, the step ``b = −η μ_M`` changes the held-out loss ``L_K`` by

    ΔL_K(η) = −η μ_Mᵀ g_K + ½ η² μ_Mᵀ H_K μ_M + O(η³),

where ``H_K`` is the held-out Hessian with respect to ``b``. The first term is the
prediction; ``retention = observed / predicted`` tends to 1 as η → 0, and the second
(computed exactly here, by differentiating ``L_K(b = t·u)`` twice in the scalar t) says
where curvature takes over. The sign of ``μ_Mᵀ g_K`` is the paper's alignment event.

**Zero-output residual block.** ``z ← z + W₂ σ(W₁ z)`` with ``W₂ = 0`` and ``W₁`` at the
usual ``nn.Linear`` initialization (the predecessor paper's insertion), acting on the
feature dimension at every position. At ``W₂ = 0`` only ``W₂`` has a gradient: the
per-example gradient is ``Σ_t q_{i,t} σ(W₁ z_{i,t})ᵀ``, which depends on the block's
features as well as on q. The step ``W₂ = −η G_M`` (G: mean gradients) predicts
``ΔL_K ≈ −η ⟨G_M, G_K⟩``; how much of it the shared-bias statistic explains is the
question the chapter asks.

**Measured where the step never looked.** ``ΔL_K`` is computed on the K examples that
formed ``g_K``: at a small step it equals ``−η μ_Mᵀg_K`` by Taylor's theorem, so its sign
agreeing with the alignment's is algebra, not evidence. With ``eval_batches`` (an
evaluation set E disjoint from the M and K examples), each step also records ``ΔL_E``
(``eval_observed``) and its own first-order value ``−η ⟨G_M, G_E⟩`` (``eval_predicted``):
whether a positive ``μ_Mᵀg_K`` comes with a lower loss on *fresh* examples is the
out-of-sample question. ``G_E`` and ``L_E`` are computed once per insertion point. Where a
float32 model's ``|ΔL_E|`` is within roundoff of the loss (``16 ε₃₂ |L_E|``) the change is
recomputed on a float64 copy of the model (``eval_float64``); if it is still below
``1e-8 max(1, |L_E|)`` (transformers' RMSNorm computes in float32 whatever the dtype) the
step is marked a tie (``eval_tie``) for the caller to leave out and count.

**Optimizer steps.** ``optimizer_steps=(10, 100)`` also trains the inserted parameter alone
by full-batch gradient descent on the M training examples, every step at the first step's
η, and records the changes on K and E after each count of steps (``optimizer_steps``).
The model's own parameters are never part of the optimization: only the inserted tensor is
differentiated, so the model is restored bit for bit as for a single step.

**Steps stated against training.** ``step_fractions`` with ``step_scale`` add steps whose δ is a
fraction of what one optimizer step of the trained model would bring the inserted parameter: ``step_scale(G_M)``
is that step's first-order decrease of the M examples' loss (for AdamW at rate ``lr``, whose first step on a new
parameter moves every coordinate by ``lr``: ``lr ‖G_M‖₁``; for SGD: ``lr ‖G_M‖²``). Those rows carry the fraction
in ``step_fraction`` (NaN on the δ grid).

**Step sizes.** :func:`train_decrease_steps` sizes each step by the first-order decrease
δ it brings to the M training examples' own loss, ``η = δ / ‖G_M‖²``; the held-out
prediction is then ``−δ ⟨G_M, G_K⟩ / ‖G_M‖²``, and one grid of δ (nats) serves models
whose gradients differ by orders of magnitude. It takes both insertions from one
backward pass per example set.

Nothing of the model changes: the insertions are forward hooks that add to the output,
the model's mode, parameters, buffers and ``.grad`` are untouched, and every hook is
removed when the function returns or raises. The refusals are those of capture
(:func:`dalign_core.capture.refusals.check_capturable`): BatchNorm in training mode, active
dropout, an unknown insertion point.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from dalign_core.capture.layers import resolve_layers
from dalign_core.capture.refusals import check_capturable
from dalign_core.growth.blocks import ZeroBlock, added, feature_dim, insertion_width, mean_loss

__all__ = ["Intervention", "StepPlan", "shared_bias_step", "residual_block_step", "train_decrease_steps",
           "train_decrease_draws", "optimizer_step_decrease", "KINDS", "ROUNDOFF_FLOAT32", "ROUNDOFF_FLOAT64"]

KINDS = ("bias", "block")
ROUNDOFF_FLOAT32 = 16 * torch.finfo(torch.float32).eps
"""A float32 loss change below this times ``|L|`` is recomputed in float64."""
ROUNDOFF_FLOAT64 = 1e-8
"""A float64 loss change below this times ``max(1, |L|)`` is a tie (transformers' RMSNorm computes in float32)."""


@dataclass(frozen=True)
class Intervention:
    """One step of size ``eta`` along the train-mean direction and what it did to the held-out loss (nats)."""

    kind: str
    """``"bias"`` (shared bias) or ``"block"`` (zero-output residual block)."""
    eta: float
    predicted: float
    """First-order change ``−η ⟨train mean, held-out mean⟩`` of the held-out loss (NaN after optimizer steps)."""
    observed: float
    """The held-out loss with the step minus without it."""
    second_order: float
    """``½ η² uᵀ H_K u``: the curvature term along the step direction ``u``."""
    alignment: float
    """``⟨train mean, held-out mean⟩`` (for the bias: ``μ_Mᵀ g_K``)."""
    train_decrease: float = math.nan
    """``η ‖train mean‖²``: the first-order decrease of the M training examples' own loss (nats)."""
    eval_observed: float = math.nan
    """The loss on the evaluation set E (disjoint from the M and K examples) with the step minus without it."""
    eval_predicted: float = math.nan
    """First-order change ``−η ⟨train mean, E mean⟩`` of the loss on E (after one step)."""
    eval_n: int = 0
    """Examples in E (0: no evaluation set)."""
    optimizer_steps: int = 0
    """Gradient-descent steps on the inserted parameter (0: the single step ``−η G_M``)."""
    eval_float64: bool = False
    """``eval_observed`` was recomputed on a float64 copy of the model (the float32 change was within roundoff)."""
    eval_tie: bool = False
    """``eval_observed`` is within roundoff of zero even in float64: its sign is not measured."""
    step_fraction: float = math.nan
    """The fraction of one optimizer step of the trained model this step's δ was set to (NaN: a δ of the grid)."""

    @property
    def retention(self) -> float:
        """observed / predicted (NaN when nothing was predicted, or after optimizer steps)."""
        return self.observed / self.predicted if self.predicted and not math.isnan(self.predicted) else math.nan


def _along_features(z: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """``vector`` (N,) shaped to broadcast along ``z``'s feature axis."""
    shape = [1] * z.ndim
    shape[feature_dim(z)] = -1
    return vector.view(shape).to(z.dtype)


def _setup(model: nn.Module, layer: str) -> tuple[nn.Module, torch.device]:
    check_capturable(model)
    (module,) = resolve_layers(model, layer).values()
    return module, next(model.parameters()).device


def _curvature(model, module, batches, device, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
    """``d²L/dt²`` at 0 of the held-out loss along ``z ← z + step(z, t)`` in the scalar t (exact, by autograd)."""
    t = torch.zeros((), device=device, dtype=torch.float64, requires_grad=True)
    # The fused attention kernels have no second derivative; the reference ("math") one is plain autograd.
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH), added(module, lambda z: step(z, t.to(z.dtype))):
        loss = mean_loss(model, batches, device)
        (first,) = torch.autograd.grad(loss, t, create_graph=True)
        (second,) = torch.autograd.grad(first, t)
    return float(second)


@torch.no_grad()
def _loss_with(model, module, batches, device, add) -> float:
    with added(module, add):
        return float(mean_loss(model, batches, device))


def _no_change(z: torch.Tensor) -> torch.Tensor:
    # The loss without the step goes through the same hook and kernels as with it, so their difference is the
    # step's effect and not a difference of roundoff between two code paths.
    return torch.zeros((), dtype=z.dtype, device=z.device)


class _Insertions:
    """The two zero-initialized insertions at one module: a shared bias and a zero-output block (both exact no-ops)."""

    def __init__(self, model: nn.Module, layer: str, probe_batch, hidden: int | None, seed: int):
        self.model, self.layer = model, layer
        self.module, self.device = _setup(model, layer)
        self.dtype = next(model.parameters()).dtype  # gradients in the model's own precision
        width = insertion_width(model, self.module, probe_batch, self.device)
        self.block = ZeroBlock(width, hidden or width, torch.Generator().manual_seed(seed))
        self._eval: tuple[list, dict, float, int] | None = None  # (E's batches, G_E, L_E, |E|)
        self._twin: _Insertions | None = None
        self._twin_base: float | None = None

    def evaluation(self, batches, kinds) -> tuple[dict[str, torch.Tensor], float, int]:
        """``G_E`` per kind, ``L_E`` and ``|E|`` of the evaluation set (computed once per set of batches)."""
        if self._eval is None or self._eval[0] is not batches:
            counted: list[int] = []
            with torch.no_grad(), added(self.module, _no_change):
                base = float(mean_loss(self.model, batches, self.device, counted))
            self._eval = (batches, self.gradients(batches, KINDS), base, counted[0])
            self._twin_base = None
        _, grads, base, n = self._eval
        return {kind: grads[kind] for kind in kinds}, base, n

    def eval_change(self, batches, kind: str, parameter: torch.Tensor) -> tuple[float, bool, bool]:
        """``L_E`` with the insertion at ``parameter`` minus without; (change, recomputed in float64, tie)."""
        base = self._eval[2]
        change = self.loss(batches, kind, parameter) - base
        if self.dtype == torch.float64:
            return change, False, abs(change) <= ROUNDOFF_FLOAT64 * max(1.0, abs(base))
        if abs(change) > ROUNDOFF_FLOAT32 * abs(base):
            return change, False, False
        if self._twin is None:  # a float64 copy of the model, made only when a change is within float32 roundoff
            twin = copy.deepcopy(self.model).double()
            self._twin = object.__new__(_Insertions)
            self._twin.__dict__.update(self.__dict__)
            self._twin.model, self._twin.dtype, self._twin._twin = twin, torch.float64, None
            self._twin.module = _setup(twin, self.layer)[0]
        if self._twin_base is None:
            self._twin_base = self._twin.loss(batches)
        change = self._twin.loss(batches, kind, parameter) - self._twin_base
        return change, True, abs(change) <= ROUNDOFF_FLOAT64 * max(1.0, abs(self._twin_base))

    def add(self, kind: str, parameter: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """What the insertion ``kind`` adds to the output z, at parameter value ``parameter`` (bias or W₂)."""
        if kind == "bias":
            return lambda z: _along_features(z, parameter)
        return lambda z: self.block.output(z, parameter)

    def gradients(self, batches, kinds: tuple[str, ...], at: dict[str, torch.Tensor] | None = None
                  ) -> dict[str, torch.Tensor]:
        """Mean-loss gradients (float64) w.r.t. each insertion's parameter, from one backward pass.

        ``at`` gives a kind's parameter value (default: zero, where the insertion is a no-op). Only the inserted
        tensors are differentiated: the model's parameters get no ``.grad``."""
        zeros = {"bias": torch.zeros(self.block.w2.shape[0], dtype=torch.float64), "block": self.block.w2}
        values = {kind: (at or {}).get(kind, zeros[kind]) for kind in kinds}
        params = {kind: values[kind].to(device=self.device, dtype=self.dtype).detach().requires_grad_(True)
                  for kind in kinds}
        adds = [self.add(kind, p) for kind, p in params.items()]
        with torch.enable_grad(), added(self.module, lambda z: sum(add(z) for add in adds)):
            grads = torch.autograd.grad(mean_loss(self.model, batches, self.device), list(params.values()))
        return {kind: g.detach().double() for kind, g in zip(params, grads)}

    def loss(self, batches, kind: str | None = None, parameter: torch.Tensor | None = None) -> float:
        """The mean loss of ``batches`` with the insertion at ``parameter`` (none: the same hook adding zero)."""
        add = _no_change if kind is None else self.add(kind, parameter.to(self.device))
        return _loss_with(self.model, self.module, batches, self.device, add)

    def curvature(self, batches, kind: str, direction: torch.Tensor) -> float:
        """``uᵀ H u``: the second derivative of the mean loss along the parameter direction ``u``."""
        direction = direction.to(self.device)
        return _curvature(self.model, self.module, batches, self.device,
                          lambda z, t: self.add(kind, t * direction)(z))


@dataclass(frozen=True)
class StepPlan:
    """Which steps a draw takes and where each is measured (see :func:`train_decrease_steps` for each field).

    ``etas_of(‖G_M‖²)`` gives the grid's (η, δ) pairs; the other fields are checked by :meth:`checked`.
    """

    kinds: tuple[str, ...]
    etas_of: Callable[[float], list[tuple[float, float]]]
    curvature: bool = True
    eval_batches: list | None = None
    optimizer_steps: tuple[int, ...] = ()
    optimizer_decrease: float | None = None
    step_fractions: tuple[float, ...] = ()
    step_scale: Callable[[torch.Tensor], float] | None = None
    eval_decreases: frozenset[float] | None = None
    eval_kinds: frozenset[str] | None = None

    @classmethod
    def checked(cls, decreases: Iterable[float], kinds: Iterable[str] = KINDS, curvature: bool = True,
                eval_batches: list | None = None, optimizer_steps: Iterable[int] = (),
                optimizer_decrease: float = 1e-2, step_fractions: Iterable[float] = (),
                step_scale: Callable[[torch.Tensor], float] | None = None,
                eval_decreases: Iterable[float] | None = None, eval_kinds: Iterable[str] | None = None) -> "StepPlan":
        """The plan of :func:`train_decrease_draws`' arguments, each checked (``ValueError`` naming the one that is
        wrong); the grid's η is ``δ / ‖G_M‖²`` for each δ of ``decreases``."""
        kinds = tuple(kinds)
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown or not kinds:
            raise ValueError(f"kinds {kinds} must be a non-empty selection of {KINDS}")
        decreases = [float(d) for d in decreases]
        if not decreases or min(decreases) <= 0:
            raise ValueError(f"decreases {decreases} must be positive losses in nats")
        optimizer_steps = tuple(int(n) for n in optimizer_steps)
        if any(n < 1 for n in optimizer_steps) or not optimizer_decrease > 0:
            raise ValueError(f"optimizer_steps {optimizer_steps} must be positive counts and optimizer_decrease "
                             f"{optimizer_decrease} a positive loss in nats")
        if eval_batches is not None and not eval_batches:
            raise ValueError("eval_batches is empty: pass None for no evaluation set")
        step_fractions = tuple(float(f) for f in step_fractions)
        if step_fractions and (step_scale is None or min(step_fractions) <= 0):
            raise ValueError(f"step_fractions {step_fractions} must be positive and come with a step_scale (the "
                             "first-order decrease of one optimizer step, a function of the train gradient)")
        if eval_decreases is not None:
            eval_decreases = frozenset(float(d) for d in eval_decreases)
            if not eval_decreases <= set(decreases):
                raise ValueError(f"eval_decreases {sorted(eval_decreases)} must be among decreases {decreases}")
        if eval_kinds is not None:
            eval_kinds = frozenset(eval_kinds)
            if not eval_kinds <= set(kinds):
                raise ValueError(f"eval_kinds {sorted(eval_kinds)} must be among kinds {kinds}")
        return cls(kinds, lambda norm_sq: [(d / norm_sq if norm_sq > 0 else 0.0, d) for d in decreases], curvature,
                   eval_batches, optimizer_steps, float(optimizer_decrease), step_fractions, step_scale,
                   eval_decreases, eval_kinds)


def _steps(insertions: _Insertions, train_batches, heldout_batches, plan: StepPlan) -> list[Intervention]:
    """Each kind's steps ``−η G_M``, (η, δ) from ``plan.etas_of(‖G_M‖²)``: predicted, observed, curvature; with
    ``plan.eval_batches`` the change on E too (of the grid's steps only those of δ in ``eval_decreases``, when given:
    every step fraction and optimizer step is measured on E; of the kinds only ``eval_kinds``, when given); with
    ``optimizer_steps`` gradient descent on the inserted parameter alone (η from ``optimizer_decrease``), read after
    each count of steps; with ``step_fractions`` the steps of δ = each fraction of ``step_scale(G_M)`` (one optimizer
    step's first-order decrease)."""
    kinds, eval_batches, eval_kinds, eval_decreases = plan.kinds, plan.eval_batches, plan.eval_kinds, plan.eval_decreases
    optimizer_steps, optimizer_decrease = plan.optimizer_steps, plan.optimizer_decrease
    train = insertions.gradients(train_batches, kinds)
    heldout = insertions.gradients(heldout_batches, kinds)
    base = insertions.loss(heldout_batches)
    evaluation, eval_n = (insertions.evaluation(eval_batches, kinds)[::2] if eval_batches is not None
                          else ({}, 0))
    out = []

    def record(kind, eta, decrease, parameter, alignment, second_order, steps, fraction=math.nan):
        observed = insertions.loss(heldout_batches, kind, parameter) - base
        extra = {}
        on_grid = not steps and math.isnan(fraction)
        if eval_batches is not None and (eval_kinds is None or kind in eval_kinds) and not (
                on_grid and eval_decreases is not None and float(decrease) not in eval_decreases):
            change, float64, tie = insertions.eval_change(eval_batches, kind, parameter)
            extra = dict(eval_observed=change, eval_n=eval_n, eval_float64=float64, eval_tie=tie,
                         eval_predicted=-float(eta) * float((train[kind] * evaluation[kind]).sum()) if not steps
                         else math.nan)
        # After optimizer steps there is no first-order prediction of one step: predicted (and retention) are NaN.
        predicted = -float(eta) * alignment if not steps else math.nan
        out.append(Intervention(kind, float(eta), predicted, observed, second_order, alignment,
                                float(decrease), optimizer_steps=steps, step_fraction=float(fraction), **extra))

    for kind in kinds:
        alignment = float((train[kind] * heldout[kind]).sum())
        norm_sq = float((train[kind] ** 2).sum())
        direction = -train[kind]
        curve = insertions.curvature(heldout_batches, kind, direction) if plan.curvature else math.nan
        for eta, decrease in plan.etas_of(norm_sq):
            record(kind, eta, decrease, eta * direction, alignment, 0.5 * float(eta) ** 2 * curve, 0)
        if plan.step_fractions:
            one_step = float(plan.step_scale(train[kind]))  # one optimizer step's first-order decrease (nats)
            for fraction in plan.step_fractions:
                decrease = fraction * one_step
                eta = decrease / norm_sq if norm_sq > 0 else 0.0
                record(kind, eta, decrease, eta * direction, alignment, 0.5 * float(eta) ** 2 * curve, 0, fraction)
        if optimizer_steps:
            eta = optimizer_decrease / norm_sq if norm_sq > 0 else 0.0
            parameter, done = torch.zeros_like(direction), 0
            for target in sorted(set(optimizer_steps)):
                while done < target:  # full-batch gradient descent on the M examples, the inserted tensor alone
                    gradient = train[kind] if done == 0 else insertions.gradients(train_batches, (kind,),
                                                                                    {kind: parameter})[kind]
                    parameter = parameter - eta * gradient
                    done += 1
                record(kind, eta, optimizer_decrease, parameter, alignment, math.nan, target)
    return out


def shared_bias_step(model: nn.Module, layer: str, train_batches: list, heldout_batches: list,
                     etas: Iterable[float]) -> list[Intervention]:
    """A shared bias at ``layer`` stepped to ``−η μ_M`` for each η; see the module docstring.

    Args:
        model: a trained model in a capturable state (``model.eval()`` for BatchNorm or dropout).
        layer: the insertion point (a dotted module name).
        train_batches: the M training examples, as batches :func:`dalign_core.capture.hooks.accumulate_geometry` takes.
        heldout_batches: the K held-out examples, likewise.
        etas: step sizes (units: the bias moves by ``η ‖μ_M‖``).

    Returns:
        One :class:`Intervention` per η (``kind="bias"``), in the order given.
    """
    etas = list(etas)
    insertions = _Insertions(model, layer, heldout_batches[0], None, 0)
    return _steps(insertions, train_batches, heldout_batches,
                  StepPlan(("bias",), lambda norm_sq: [(eta, eta * norm_sq) for eta in etas]))


def residual_block_step(model: nn.Module, layer: str, train_batches: list, heldout_batches: list,
                        etas: Iterable[float], hidden: int | None = None, seed: int = 0) -> list[Intervention]:
    """A zero-output residual block at ``layer`` whose ``W₂`` is stepped to ``−η G_M``; see the module docstring.

    ``hidden`` is the block's width (default: the insertion point's width N); ``seed``
    draws ``W₁``. Arguments and return as in :func:`shared_bias_step` (``kind="block"``).
    """
    etas = list(etas)
    insertions = _Insertions(model, layer, heldout_batches[0], hidden, seed)
    return _steps(insertions, train_batches, heldout_batches,
                  StepPlan(("block",), lambda norm_sq: [(eta, eta * norm_sq) for eta in etas]))


def train_decrease_steps(model: nn.Module, layer: str, train_batches: list, heldout_batches: list,
                         decreases: Iterable[float], kinds: Iterable[str] = KINDS, hidden: int | None = None,
                         seed: int = 0, **options) -> list[Intervention]:
    """Both insertions on the same examples, each step sized by the train loss it removes at first order.

    For each kind and each δ in ``decreases`` (nats), ``η = δ / ‖G_M‖²``, so the step
    ``−η G_M`` lowers the M training examples' loss by δ to first order whatever the
    gradient's scale: one grid of δ serves every family, width and insertion point.
    The held-out prediction is then ``−δ ⟨G_M, G_K⟩ / ‖G_M‖²``. One backward pass per
    example set gives both kinds' gradients. ``curvature=False`` skips the
    second-order term (NaN), the costly part, when only signs are wanted. The ``options`` (every keyword of
    :meth:`StepPlan.checked` but ``decreases`` and ``kinds``):

    ``curvature`` (default True); ``eval_batches``: an evaluation set E, disjoint from the M and K examples (the caller's
    guarantee), on which every step's change is measured too (``eval_observed``).
    ``optimizer_steps``: after each of these counts of full-batch gradient-descent steps on
    the M examples that train the inserted parameter alone (η from ``optimizer_decrease``:
    the first step lowers the M examples' loss by that much at first order), one more row.
    ``step_fractions``: steps of δ = each fraction times ``step_scale(G_M)``, the first-order decrease one optimizer
    step of the trained model would bring (a function of the float64 train gradient; see the module docstring).
    ``eval_decreases``: the δ of ``decreases`` whose steps are measured on E (None: all of them); the others'
    ``eval_observed`` is NaN; ``eval_kinds`` likewise the kinds measured on E. Each E measurement is a pass over E,
    the retention study's main cost.

    Returns:
        Per kind (in the order given): one :class:`Intervention` per δ, one per step fraction, then one per
        optimizer-step count.
    """
    return next(train_decrease_draws(model, layer, [(train_batches, heldout_batches)], decreases, kinds=kinds,
                                     hidden=hidden, seed=seed, **options))


def train_decrease_draws(model: nn.Module, layer: str, draws: Iterable[tuple[list, list]],
                         decreases: Iterable[float], kinds: Iterable[str] = KINDS, hidden: int | None = None,
                         seed: int = 0, **options) -> Iterator[list[Intervention]]:
    """:func:`train_decrease_steps` for each ``(train_batches, heldout_batches)`` of ``draws``, in order.

    The insertion point is resolved, the model checked and the block's ``W₁`` drawn once
    for all draws (the same block in every draw), and ``G_E``, ``L_E`` of the evaluation set
    computed once, so many resamples of (M, K) cost only their own passes. Yields one list
    of :class:`Intervention` per draw. ``options`` as in :func:`train_decrease_steps`; every argument is checked
    before the first draw (:meth:`StepPlan.checked`).
    """
    return _each_draw(model, layer, draws, hidden, seed, StepPlan.checked(decreases, kinds, **options))


def optimizer_step_decrease(optimizer: str, lr: float) -> Callable[[torch.Tensor], float]:
    """``G ↦`` the first-order decrease (nats) of one step of the trained model's optimizer on a new parameter of
    gradient G: AdamW's first step moves every coordinate by ``lr`` (``lr ‖G‖₁``), SGD's by ``lr G`` (``lr ‖G‖²``)."""
    if optimizer == "sgd":
        return lambda gradient: lr * float((gradient ** 2).sum())
    if optimizer in ("adamw", "adam"):
        return lambda gradient: lr * float(gradient.abs().sum())
    raise ValueError(f"optimizer {optimizer!r} has no stated step: use 'adamw' or 'sgd'")


def _each_draw(model, layer, draws, hidden, seed, plan: StepPlan) -> Iterator[list[Intervention]]:
    insertions = None
    for train_batches, heldout_batches in draws:
        if insertions is None:  # the block's width is the insertion point's, known from the first forward pass
            insertions = _Insertions(model, layer, heldout_batches[0], hidden, seed)
        yield _steps(insertions, train_batches, heldout_batches, plan)
