"""The dry run: build every model, time a few training steps, a capture, an evaluation and the redundancy check
at each width, and project the full sweep's time, on this machine and shared among devices.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from dalign_repro.training import distributed
from dalign_repro.training import workers
from dalign_core.device import resolve_device
from dalign_repro.sweep.family import Family, SweepConfig, count, take
from dalign_core.capture.hooks import accumulate_geometry
from dalign_repro.sweep.measure import measure_redundancy, checkpoint_pool
from dalign_repro.sweep.plan import job_grid, planned_checks, trainings
from dalign_repro.sweep.pools import prepare
from dalign_repro.training.loop import TrainConfig, train

__all__ = ["dry_run"]


def dry_run(config: SweepConfig, family: Family, steps: int = 2, also_seeds: Sequence[int] = ()) -> str:
    """Build the data and every model, time ``steps`` training steps, one capture batch, one evaluation batch and the
    redundancy check on one batch, and project the full run.

    Each model first takes ``steps`` warm-up steps; on a GPU at least 20 steps are timed. ``also_seeds``: numbers
    of seeds at which the same sweep is projected again from the same timings (its rate fit unchanged), a line each.

    Returns the projection as text, the arithmetic shown. Nothing is
    written to the results folder and no checkpoint is kept.
    """
    device = resolve_device(config.device)
    # A GPU's clocks ramp up over the first fraction of a second: a couple of steps overstate its step time
    # (seen on an H200: 472 ms/step timed over 2 steps where whole runs went more than twice as fast).
    steps = steps if device.type == "cpu" else max(steps, 20)
    splits, facts, pools = prepare(config, family)
    heldout, evaluation = take(splits.test, pools.heldout), take(splits.test, pools.evaluation)
    every_layer, primary_only = _pool_passes(config)
    lines = _plan_lines(config, family, splits, facts, every_layer, primary_only)
    costs = {}
    from tqdm import tqdm  # a width's timing takes minutes at the gpu profile: show progress with an ETA

    for width in tqdm(config.widths, desc=f"dry run of {family.name}: timing each width", unit="width",
                      disable=None):
        costs[width] = _time_width(config, family, splits, heldout, evaluation, width, steps, device)
    total, training_seconds, measuring_seconds, width_lines = _project(config, costs, every_layer, primary_only)
    lines += width_lines
    lines.append(f"projected: {_seconds(total)} s ({total / 60:.1f} min) plus resampling and start-up")
    lines += _shared_lines(config, training_seconds, measuring_seconds)
    for seeds in also_seeds:
        other = dataclasses.replace(config, seeds=seeds)
        total, training_seconds, measuring_seconds, _ = _project(other, costs, every_layer, primary_only)
        local = _local_workers()
        line = f"at {seeds} seeds, the same timings: {_seconds(total)} s ({total / 60:.1f} min) on one process"
        if local > 1:
            shared = _makespan(other, training_seconds, measuring_seconds, local)
            line += f", {_seconds(shared)} s ({shared / 60:.1f} min) on this machine's {local} one-thread workers"
        lines.append(line)
    return "\n".join(lines)


def _project(config: SweepConfig, costs: dict[int, dict[str, float]], every_layer: float, primary_only: float
             ) -> tuple[float, dict[int, float], dict[int, float], list[str]]:
    """The whole sweep's seconds on one process from each width's timed ``costs``: (total, one run's training
    seconds by width, one run's measuring seconds by width, a line of arithmetic per width)."""
    runs_at = trainings(config)  # full-run equivalents at each width, from the sweep's job grid
    total, training_seconds, measuring_seconds, lines = 0.0, {}, {}, []
    for width, cost in costs.items():
        training = cost["step"] * config.steps * runs_at[width]
        per_run = (cost["capture_every"] * every_layer + cost["capture_primary"] * primary_only
                   + cost["evaluation"] * len(config.checkpoint_steps)
                   + cost["capture_primary"] * config.eval_examples / config.pool_size + cost["redundancy"])
        measuring = per_run * config.seeds
        total += training + measuring
        training_seconds[width], measuring_seconds[width] = cost["step"] * config.steps, per_run
        lines.append(f"  N={width}: {cost['step'] * 1e3:.1f} ms/step x {config.steps} steps x {runs_at[width]:.3g} = "
                     f"{training:.0f} s training; ({cost['capture_every']:.2f} s x {every_layer:.3g} + "
                     f"{cost['capture_primary']:.2f} s x {primary_only:.3g} capture, {cost['evaluation']:.2f} s x "
                     f"{len(config.checkpoint_steps)} evaluation, {cost['redundancy']:.2f} s redundancy) per run x "
                     f"{config.seeds} = {measuring:.0f} s measuring")
    return total, training_seconds, measuring_seconds, lines


def _pool_passes(config: SweepConfig) -> tuple[float, float]:
    """Pool captures per measured run, in pools' worth of examples, at every insertion point and at the primary one
    alone (each checkpoint's share is :func:`checkpoint_pool`'s), as ``measure_trained`` makes them: every layer at
    ``all_layer_steps``, else the primary one; all reductions share each pass."""
    passes = [(step in config.train_pool_checkpoints) + 1 for step in config.checkpoint_steps]
    share = [len(checkpoint_pool(config, torch.arange(config.pool_size), step)) / config.pool_size
             for step in config.checkpoint_steps]
    every_layer = sum(n * f for step, n, f in zip(config.checkpoint_steps, passes, share) if config.layer_steps(step))
    return every_layer, sum(n * f for n, f in zip(passes, share)) - every_layer


def _plan_lines(config: SweepConfig, family: Family, splits, facts: dict, every_layer: float,
                primary_only: float) -> list[str]:
    """The projection's first lines: the data, the rate fit's trials and what each measured run captures."""
    share = min(len(checkpoint_pool(config, torch.arange(config.pool_size), step)) / config.pool_size
                for step in config.checkpoint_steps)
    return [f"dry run of {family.name} at profile {config.profile} on {resolve_device(config.device)}: "
            f"{count(splits.train)} train, {count(splits.validation)} validation, {count(splits.test)} test "
            f"{splits.unit}; {facts['epochs']:.2f} epochs per run",
            f"rate fit ({config.lr_fit}): {len(config.lr_candidates)} trials of {config.trial_steps} steps at "
            + ("every width" if len(config.fitted_widths) > 1 else f"N={config.fitted_widths[0]}")
            + (f", then 2 trainings at N={max(config.widths)} for the full-length check" if config.full_check else "")
            + " (grid extensions not counted)",
            f"per width: {config.seeds} measured runs x "
            f"{every_layer + primary_only:.3g} pool captures ({every_layer:.3g} at every insertion point, "
            f"{primary_only:.3g} at the primary one; {len(family.reductions)} reduction(s) from each backward pass) of "
            f"{config.pool_size} examples" + (f" (checkpoints before the last capture {share * config.pool_size:.0f} "
                                              "of them)" if share < 1 else "")]


def _time_width(config: SweepConfig, family: Family, splits, heldout, evaluation, width: int, steps: int,
                device: torch.device) -> dict[str, float]:
    """Seconds at one width, each timed after a warm-up: a training step (``step``), a whole pool's capture at every
    insertion point and at the primary one (``capture_every``, ``capture_primary``), one checkpoint's held-out
    evaluation (``evaluation``) and the redundancy check (``redundancy``; 0 when the config runs none)."""
    model = family.build(config, width, config.seed, splits).to(device)
    probe = TrainConfig(steps=steps, batch_size=config.batch_size, lr=min(config.lr_grid(width)),
                        seed=config.seed, autocast_dtype=config.autocast_dtype, progress=False,
                        **family.train_settings(config))
    run_steps = lambda: train(model, splits.train, probe, loss_fn=family.train_loss)  # noqa: E731
    cost = {"step": _timed(device, run_steps, run_steps) / steps}  # warm-up: kernels, allocator, caches
    model.eval()
    batch = family.batches(take(heldout, torch.arange(min(config.capture_batch, count(heldout)))), config.capture_batch)
    for which, layers in (("every", family.insertion_points(config, model)), ("primary", [family.primary_layer(config)])):
        seconds = _timed(device,
                         lambda: accumulate_geometry(model, layers, batch, reduction=list(family.reductions),
                                                     device=device),
                         lambda: accumulate_geometry(model, layers, batch, reduction=list(family.reductions),
                                                     device=device, check_determinism=False))
        cost[f"capture_{which}"] = seconds * config.pool_size / config.capture_batch
    # the rest of a measured run: the held-out evaluation at every checkpoint, the capture of the evaluation
    # set for the certificates' out-of-sample check, and the redundancy check's per-example gradients
    probe_examples = take(evaluation, torch.arange(min(config.capture_batch, count(evaluation))))
    evaluate = lambda: family.evaluate(model, probe_examples, config)  # noqa: E731
    cost["evaluation"] = _timed(device, evaluate, evaluate) * config.eval_examples / count(probe_examples)
    cost["redundancy"] = 0.0
    if config.redundancy_examples:
        examples = min(config.redundancy_examples, config.capture_batch, count(heldout))
        seconds = _timed(device,
                         lambda: measure_redundancy(config, family, model, heldout, min(8, examples), device,
                                                    config.seed),
                         lambda: measure_redundancy(config, family, model, heldout, examples, device, config.seed))
        cost["redundancy"] = seconds * config.redundancy_examples / examples
    return cost


def _timed(device: torch.device, warm_up, work) -> float:
    """Seconds ``work()`` takes after one ``warm_up()``, the device synchronized around it."""
    warm_up()
    _sync(device)
    start = time.perf_counter()
    work()
    _sync(device)
    return time.perf_counter() - start


def _makespan(config: SweepConfig, training_seconds: dict[int, float], measuring_seconds: dict[int, float],
              world: int) -> float:
    """Seconds of the sweep shared among ``world`` devices: the plan's makespan (rates, their check, then seeds,
    longest job first)."""
    sizes = distributed.ranks_per_job(config.widths, world)
    trials, runs = job_grid(config, sizes, training_seconds, measuring_seconds)
    checks = planned_checks(config, sizes, training_seconds)
    return sum(max((a.end for a in distributed.plan(jobs, world)), default=0.0) for jobs in (trials, checks, runs))


def _local_workers() -> int:
    """The workers a plain ``python -m ...`` uses on this machine (one under torchrun, whose ranks share the jobs)."""
    return workers.count() if distributed.context().world_size == 1 else 1


def _shared_lines(config: SweepConfig, training_seconds: dict[int, float],
                  measuring_seconds: dict[int, float]) -> list[str]:
    """The projection's last lines: the sweep on this machine's workers and shared among 8 devices (and among the
    running world's, under torchrun), each the plan's makespan (:func:`_makespan`)."""
    lines = []
    local = _local_workers()
    if local > 1:  # what a plain `python -m ...` on this machine does by default
        seconds = _makespan(config, training_seconds, measuring_seconds, local)
        lines.append(f"on this machine's {local} one-thread workers (the default; DALIGN_WORKERS): "
                     f"{_seconds(seconds)} s ({seconds / 60:.1f} min), if nothing else runs")
    for world in sorted({8, distributed.context().world_size} - {1}):
        seconds = _makespan(config, training_seconds, measuring_seconds, world)
        lines.append(f"on {world} such devices sharing the jobs (torchrun --nproc_per_node={world}; the plan of "
                     f"dalign_repro.training.distributed, rates first, then seeds): {_seconds(seconds)} s "
                     f"({seconds / 60:.1f} min)")
    return lines


def _seconds(seconds: float) -> str:
    """Seconds to at least 4 significant digits, and no exponent: a short toy run's projection stays readable."""
    return f"{seconds:.0f}" if seconds >= 1000 else f"{seconds:.4g}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
