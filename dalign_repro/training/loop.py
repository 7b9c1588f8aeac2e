"""A small, deterministic training loop with checkpoints and resume.

Written for causal LMs but general: the caller passes ``loss_fn(model, batch) -> scalar`` (default
:func:`~dalign_repro.training.evaluation.lm_loss`; held-out losses: :mod:`dalign_repro.training.evaluation`)
and ``data``, a tensor (or tuple of tensors) whose first dimension indexes examples.

* AdamW (default) or SGD with momentum (``optimizer="sgd"``, the CIFAR ResNet recipe);
  linear warmup, then cosine decay to ``min_lr_ratio * lr`` (default) or steps down by
  ``gamma`` at fractions ``milestones`` of training (``schedule="step"``); weight decay
  on parameters with 2 or more dimensions only (matrices, kernels and embeddings, not
  norms/biases); optional gradient-norm clipping.
* Data order: each epoch is a permutation of the examples drawn from a
  ``torch.Generator`` seeded with ``(seed, epoch)``; step ``s`` uses global positions
  ``s*B .. s*B+B-1`` of the concatenated epochs.  The data position is therefore the
  step number, and resuming needs no sampler state.
* Checkpoints in ``checkpoint_dir/step_XXXXXXX/`` (:mod:`dalign_repro.training.checkpoints`):
  ``model.safetensors`` (weights) and, for resume points, ``state.pt`` (optimizer state,
  the step, global RNG states, the loss history, the config), saved with plain tensors
  and Python scalars so it loads with ``torch.load(weights_only=True)``.  A checkpoint folder is written under a
  temporary name and renamed, so a crash never leaves a half-written checkpoint.
  Resume points are every ``checkpoint_every`` steps and the final step; older resume
  points are pruned (keeping ``keep_resume``).  Requested analysis checkpoints
  (``checkpoint_steps``, step 0 = the untrained model) keep their weights.
* ``train(..., resume=True)`` continues from the latest resume point; on the CPU with
  the same thread count the final weights are bitwise those of an uninterrupted run.
  A finished run found on disk returns at once.

Without a ``checkpoint_dir`` nothing is written and the requested checkpoints are kept
in memory as CPU state dicts.

* Data parallel: ``train(..., group=g)`` trains one model on the ranks of the
  ``torch.distributed`` process group ``g`` (all calling ``train`` together with the same
  model, data and config) through ``DistributedDataParallel``. Every rank draws the same
  global batch of step ``s`` and takes its contiguous slice ``B / |g|``; DDP averages the
  slices' gradients, which is the gradient of the global batch's mean loss, so training
  matches one process at the same seed and batch size to float rounding (for a loss that
  is a mean over the batch's examples, and no batch statistics: BatchNorm is refused).
  The group's first rank writes the checkpoints (the others wait for them), every rank
  resumes from them, and the fingerprint is the same as in one process: a run may resume
  on a different number of ranks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from dalign_core.seeding import derived_seed
from dalign_repro.training.checkpoints import (
    CHECKPOINT_FORMAT,
    history_rows,
    history_tensors,
    prune_checkpoints,
    rng_state,
    set_rng_state,
    model_weights,
    write_checkpoint,
    list_checkpoints,
    load_state,
    load_weights,
)
from dalign_repro.training.evaluation import autocast_to, data_len, take_rows, lm_loss

__all__ = [
    "TrainConfig",
    "TrainResult",
    "train",
    "make_optimizer",
    "batch_indices",
]



@dataclass
class TrainConfig:
    """Optimization and checkpointing settings.

    Fields that change the trained weights (everything but the checkpoint and display
    settings) are recorded in each checkpoint; resuming with different values raises.
    """

    steps: int
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    optimizer: str = "adamw"
    """``"adamw"`` (with ``betas``, ``eps``) or ``"sgd"`` (heavy-ball, with ``momentum``)."""
    momentum: float = 0.9
    schedule: str = "cosine"
    """``"cosine"``: warmup, then cosine decay to ``min_lr_ratio * lr``. ``"step"``: warmup, then the rate is
    multiplied by ``gamma`` at each of ``milestones`` (fractions of ``steps``: 0.5 and 0.75 are epochs 100 and 150
    of 200)."""
    milestones: tuple[float, ...] = ()
    gamma: float = 0.1
    seed: int = 0
    """Seeds the data order (the model's initialization is seeded where it is built)."""
    autocast_dtype: str | None = None
    """e.g. ``"bfloat16"`` for mixed precision on a GPU; None = full precision."""
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    """Write a resume point every this many steps (and always at the final step)."""
    checkpoint_steps: tuple[int, ...] = ()
    """Steps whose weights are kept for analysis; 0 is the untrained model."""
    keep_resume: int = 1
    progress: bool = True
    """Show a tqdm progress bar."""

    _NOT_FINGERPRINTED = ("checkpoint_dir", "checkpoint_every", "checkpoint_steps", "keep_resume", "progress")
    _OPTIMIZERS = ("adamw", "sgd")
    _SCHEDULES = ("cosine", "step")
    _LATER_FIELDS = {"optimizer": "adamw", "momentum": 0.9, "schedule": "cosine", "milestones": [], "gamma": 0.1}
    """Fields added after checkpoints were first written: left out of a fingerprint at these values, so those
    checkpoints still resume."""

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 <= self.warmup_steps <= max(self.steps, 0):
            raise ValueError(f"warmup_steps must be in [0, steps], got {self.warmup_steps}")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1 or None, got {self.checkpoint_every}")
        bad = [s for s in self.checkpoint_steps if not 0 <= int(s) <= self.steps]
        if bad:
            raise ValueError(f"checkpoint_steps {bad} are outside [0, steps={self.steps}]")
        if self.optimizer not in self._OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {self._OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in self._SCHEDULES:
            raise ValueError(f"schedule must be one of {self._SCHEDULES}, got {self.schedule!r}")
        if any(not 0 < m < 1 for m in self.milestones):
            raise ValueError(f"milestones are fractions of training in (0, 1), got {self.milestones}")
        self.milestones = tuple(sorted(float(m) for m in self.milestones))
        self.betas = tuple(float(b) for b in self.betas)
        self.checkpoint_steps = tuple(sorted({int(s) for s in self.checkpoint_steps}))

    def lr_at(self, step: int) -> float:
        """Learning rate of the update taken at 0-based ``step`` (producing weights at step+1)."""
        if self.warmup_steps and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == "step":
            return self.lr * self.gamma ** sum(step >= m * self.steps for m in self.milestones)
        span = max(self.steps - self.warmup_steps, 1)
        progress = min(max((step - self.warmup_steps) / span, 0.0), 1.0)
        floor = self.min_lr_ratio * self.lr
        return floor + (self.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def fingerprint(self) -> dict[str, Any]:
        """The settings that determine the weights (JSON-able)."""
        d = dataclasses.asdict(self)
        for k in self._NOT_FINGERPRINTED:
            d.pop(k, None)
        d["betas"] = list(d["betas"])
        d["milestones"] = list(d["milestones"])
        for name, default in self._LATER_FIELDS.items():
            if d[name] == default:
                del d[name]
        return d


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    history: list[dict[str, float]]
    """One row per step: ``step`` (1-based, weights after the update), ``loss`` (the
    batch loss before the update), ``lr``."""
    checkpoints: dict[int, Any]
    """Requested and final checkpoints: step -> folder (with ``checkpoint_dir``) or a CPU
    state dict (without)."""
    final_step: int
    resumed_from: int | None = None
    wall_time_s: float = 0.0

    def to_frame(self):
        """The history as a pandas DataFrame with columns ``step``, ``loss``, ``lr`` (one row per step)."""
        import pandas as pd  # noqa: PLC0415

        return pd.DataFrame(self.history, columns=["step", "loss", "lr"])



class _Order:
    """Per-epoch permutations of ``range(n)`` from seeded generators, cached."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self._perms = n, seed, {}

    def perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            g = torch.Generator().manual_seed(derived_seed("dalign-order", self.seed, epoch))
            self._perms[epoch] = torch.randperm(self.n, generator=g)
        return self._perms[epoch]

    def batch(self, step: int, batch_size: int) -> torch.Tensor:
        k = torch.arange(step * batch_size, (step + 1) * batch_size)
        epochs, pos = k // self.n, k % self.n
        out = torch.empty(batch_size, dtype=torch.int64)
        for e in torch.unique(epochs).tolist():
            m = epochs == e
            out[m] = self.perm(e)[pos[m]]
        return out


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """The example indices :func:`train` uses at 0-based ``step`` (for inspection)."""
    return _Order(n, seed).batch(step, batch_size)


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW or SGD (``config.optimizer``) with weight decay on parameters of 2+ dimensions, none on the rest."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps)


# ----------------------------------------------------------------------------- data parallel


def _group_shape(group) -> tuple[int, int]:
    """(this rank's index in ``group``, the group's size); (0, 1) without a group."""
    if group is None:
        return 0, 1
    return torch.distributed.get_rank(group), torch.distributed.get_world_size(group)


def _refuse_batch_statistics(model: torch.nn.Module) -> None:
    norms = [name for name, module in model.named_modules()
             if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
             and not isinstance(module, torch.nn.SyncBatchNorm)]
    if norms:
        raise ValueError(f"{norms[0]} is a BatchNorm layer: its statistics would come from each rank's slice of the "
                         "batch, not the whole batch, so data-parallel training would not match one process; train "
                         "this model on one rank (or convert it with torch.nn.SyncBatchNorm on CUDA)")


def _data_parallel(model: torch.nn.Module, group, device: torch.device):
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    return DistributedDataParallel(model, process_group=group,
                                   device_ids=[device.index] if device.type == "cuda" else None)


# ----------------------------------------------------------------------------- training


@dataclass
class _Checkpoints:
    """Where and when :func:`train` writes its checkpoints, and how it resumes from them.

    With a ``root`` folder the group's first rank (the ``leader``) writes and prunes, and every rank waits at a
    barrier until the folder is complete; without one, the requested steps' weights are kept in ``in_memory``.
    """

    config: TrainConfig
    root: Path | None
    fingerprint: dict[str, Any]
    leader: bool
    group: Any
    ranks: int
    in_memory: dict[int, dict] = dataclasses.field(default_factory=dict)

    @property
    def requested(self) -> set[int]:
        return set(self.config.checkpoint_steps)

    def is_resume_point(self, step: int) -> bool:
        """Whether the weights after ``step`` updates are saved with the state to resume from."""
        every = self.config.checkpoint_every
        return step == self.config.steps or bool(every and step % every == 0)

    def is_saved(self, step: int) -> bool:
        """Whether the weights after ``step`` updates are saved at all (asked for, or a resume point)."""
        return step in self.requested or self.is_resume_point(step)

    def restore(self, model: torch.nn.Module, optimizer, device: torch.device,
                resume: bool) -> tuple[int, list[dict]] | None:
        """Load the latest resume point into ``model``, ``optimizer`` and the global generators: its step and loss
        history, or None where there is none to resume. Raises if checkpoints exist and ``resume`` is False, or if they
        were made with another config."""
        if self.root is None:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        existing = list_checkpoints(self.root, resumable=True)
        if self.ranks > 1:  # every rank has chosen where to resume before the first rank writes anything
            torch.distributed.barrier(group=self.group)
        if existing and not resume:
            raise ValueError(f"{self.root} already holds checkpoints {list(existing)}; pass resume=True to continue "
                             "from them, or use an empty checkpoint_dir")
        if not existing:
            return None
        _, folder = max(existing.items())
        state = load_state(folder, map_location=device)
        if state.get("config") != self.fingerprint:
            raise ValueError(
                f"the checkpoint in {folder} was made with a different training config:\n"
                f"  saved:   {state.get('config')}\n  current: {self.fingerprint}\n"
                "use a new checkpoint_dir for a new run"
            )
        load_weights(model, folder)
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state({k: (v.cpu() if isinstance(v, torch.Tensor) else [t.cpu() for t in v])
                       for k, v in state["rng"].items()})
        return int(state["step"]), history_rows(state["history"])

    def _resume_state(self, step: int, optimizer, history: list[dict]) -> dict:
        """What a resume point holds beside the weights: optimizer, generators, history, config."""
        return {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "samples_seen": step * self.config.batch_size,
            "optimizer": optimizer.state_dict(),
            "rng": rng_state(),
            "history": history_tensors(history),
            "config": self.fingerprint,
        }

    def save(self, step: int, model: torch.nn.Module, optimizer, history: list[dict]) -> None:
        """Save the weights after ``step`` updates (with the resume state at a resume point)."""
        resume_point = self.is_resume_point(step)
        if self.root is None:
            if step in self.requested or step == self.config.steps:
                self.in_memory[step] = model_weights(model)
            return
        if self.leader:
            meta = {"step": step, "requested": step in self.requested, "resume_point": resume_point,
                    "config": self.fingerprint, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
            state = self._resume_state(step, optimizer, history) if resume_point else None
            write_checkpoint(self.root, step, model, state, meta)
            if resume_point:
                prune_checkpoints(self.root, self.requested, step, self.config.keep_resume)
        if self.ranks > 1:  # the others read the checkpoint folder only once it is complete
            torch.distributed.barrier(group=self.group)

    def kept(self) -> dict[int, Any]:
        """The requested and final checkpoints: step -> folder, or step -> CPU state dict without a root."""
        if self.root is None:
            return self.in_memory
        return {s: p for s, p in list_checkpoints(self.root).items()
                if s in self.requested or s == self.config.steps}


@dataclass(frozen=True)
class _Slices:
    """This rank's slice of each step's global batch: the data, its seeded order, and the rank's place."""

    data: Any
    order: _Order
    batch_size: int
    rank: int
    ranks: int
    device: torch.device

    def at(self, step: int):
        """The examples of 0-based ``step`` this rank trains on, on its device (contiguous ``B / ranks``)."""
        indices = self.order.batch(step, self.batch_size)
        share = self.batch_size // self.ranks
        return take_rows(self.data, indices[self.rank * share:(self.rank + 1) * share] if self.ranks > 1 else indices,
                         self.device)


def _checked_group(model: torch.nn.Module, config: TrainConfig, group) -> tuple[int, int]:
    """(rank, ranks) of ``group``, refusing a batch the ranks cannot split equally or a model with batch
    statistics when it trains on more than one rank."""
    rank, ranks = _group_shape(group)
    if config.batch_size % ranks:
        raise ValueError(f"batch_size {config.batch_size} does not split into {ranks} equal slices; choose a batch "
                         "size that the number of ranks divides")
    if ranks > 1:
        _refuse_batch_statistics(model)
    return rank, ranks


def _batch_loss(loss: torch.Tensor, step: int, group, ranks: int) -> torch.Tensor:
    """The global batch's loss (the mean of the equal slices' means, the same on every rank), detached; raises
    FloatingPointError if it is not finite."""
    reported = loss.detach()
    if ranks > 1:
        reported = reported.float().clone()
        torch.distributed.all_reduce(reported, group=group)
        reported /= ranks
    if not torch.isfinite(reported):
        raise FloatingPointError(f"loss is {reported.item()} at step {step}; lower the learning rate")
    return reported


def _update(model: torch.nn.Module, optimizer, loss: torch.Tensor, grad_clip: float | None) -> None:
    """One optimizer step on ``loss``'s gradient, clipped to norm ``grad_clip`` where it is set."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()


def train(
    model: torch.nn.Module,
    data,
    config: TrainConfig,
    *,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] = lm_loss,
    resume: bool = True,
    description: str = "train",
    group: Any = None,
) -> TrainResult:
    """Train ``model`` in place on ``data`` for ``config.steps`` optimizer steps.

    Args:
        model: the model, freshly initialized (its parameters' device is used).
            When resuming, its weights are replaced by the checkpoint's.
        data: a tensor or a tuple of tensors whose first dimension indexes examples
            (for an LM: the ``(n, T)`` int64 sequences); it may stay on the CPU.
        config: see :class:`TrainConfig`.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``; default :func:`lm_loss`.
        resume: continue from the latest resume point in ``config.checkpoint_dir``
            (raising if it was made with a different config).  ``False`` refuses to run
            over existing checkpoints.
        description: the progress bar's label.
        group: a ``torch.distributed`` process group whose ranks train this model together
            (data parallel; see the module docstring); None trains in this process alone.

    Returns:
        A :class:`TrainResult` (history, checkpoints, ...).
    """
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    rank, ranks = _checked_group(model, config, group)
    slices = _Slices(data, _Order(data_len(data), config.seed), config.batch_size, rank, ranks, device)
    checkpoints = _Checkpoints(config, Path(config.checkpoint_dir) if config.checkpoint_dir else None,
                               config.fingerprint(), leader=rank == 0, group=group, ranks=ranks)
    optimizer = make_optimizer(model, config)
    restored = checkpoints.restore(model, optimizer, device, resume)
    resumed_from, history = restored if restored else (None, [])
    start = resumed_from or 0
    if start == 0 and (0 in checkpoints.requested or config.steps == 0):
        checkpoints.save(0, model, optimizer, history)

    autocast = autocast_to(device, config.autocast_dtype)
    model.train()
    stepper = model if ranks == 1 else _data_parallel(model, group, device)
    bar = tqdm(total=config.steps, initial=start, desc=description, disable=not (config.progress and rank == 0),
               dynamic_ncols=True, leave=False)
    try:
        for step in range(start, config.steps):
            lr = config.lr_at(step)
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr
            batch = slices.at(step)
            with autocast:
                loss = loss_fn(stepper, batch)
            reported = _batch_loss(loss, step, group, ranks)
            _update(model, optimizer, loss, config.grad_clip)
            history.append({"step": step + 1, "loss": float(reported), "lr": lr})
            bar.update(1)
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", lr=f"{lr:.2e}", refresh=False)
            if checkpoints.is_saved(step + 1):
                checkpoints.save(step + 1, model, optimizer, history)
    finally:
        bar.close()
        del stepper  # DistributedDataParallel's gradient hooks go with it: later backward passes stay local
    return TrainResult(history=history, checkpoints=checkpoints.kept(), final_step=config.steps,
                       resumed_from=resumed_from, wall_time_s=time.perf_counter() - t0)
