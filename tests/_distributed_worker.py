"""What tests/test_distributed.py starts under ``torchrun --nproc_per_node=2`` (or plain ``python``: a world of one).

    python tests/_distributed_worker.py sweep --out DIR [--ranks-per-job SPEC] [--kill-rank R --kill-at-step K]
    python tests/_distributed_worker.py checks

``sweep`` runs the toy width sweep of tests/test_sweep.py through the experiment runner
(the tables and provenance go to DIR; checkpoints to $DALIGN_CHECKPOINTS). With
``--kill-rank``, that rank kills itself (SIGKILL, no clean-up) at its K-th training step.
``checks`` compares data-parallel training with one process, and the sharded Gram
estimates with the one-shot ones, on every rank; it prints ``checks OK`` on rank 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_sweep import ToyConfig, ToyFamily  # noqa: E402

from dalign_repro.training import distributed, sharded  # noqa: E402
from dalign_core.geometry.estimators import estimate_geometry  # noqa: E402
from dalign_repro.experiments._runner import run_experiment  # noqa: E402
from dalign_core.geometry.misalignment import cross_gram, misalignment_probability  # noqa: E402
from dalign_repro.sweep.plan import jobs_dir  # noqa: E402
from dalign_repro.sweep.run import run_sweep, tables_of  # noqa: E402
from dalign_repro.training.checkpoints import list_checkpoints, load_weights  # noqa: E402
from dalign_repro.training.evaluation import lm_loss  # noqa: E402
from dalign_repro.training.loop import TrainConfig, train  # noqa: E402

CONFIG = ToyConfig(widths=(8, 16, 24), seeds=2)


class KillingFamily(ToyFamily):
    """The toy family, whose rank ``kill_rank`` dies at its ``kill_at``-th training step."""

    def __init__(self, kill_rank: int | None, kill_at: int):
        self.kill_rank, self.kill_at, self.steps = kill_rank, kill_at, 0

    def train_loss(self, model, batch):
        self.steps += 1
        if self.kill_rank == distributed.context().rank and self.steps == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().train_loss(model, batch)


def sweep(args) -> None:
    family = KillingFamily(args.kill_rank, args.kill_at_step)
    with distributed.session("cpu"):
        run_experiment("toy", tables_of(family), CONFIG,
                       lambda c, out: run_sweep(c, family, jobs=jobs_dir(out, c, family),
                                                ranks_per_job=args.ranks_per_job),
                       out_dir=args.out, sharded=True)


def _close(a: torch.Tensor, b: torch.Tensor, what: str, rtol: float, atol: float) -> None:
    if not torch.allclose(a, b, rtol=rtol, atol=atol):
        raise AssertionError(f"{what}: largest difference {float((a - b).abs().max()):.3g}")


def check_data_parallel(folder: Path) -> None:
    """DDP over 2 ranks: the averaged gradient and the trained weights match one process on the global batch."""
    from dalign_repro.models import LlamaWidthSpec, build_llama  # noqa: PLC0415  (transformers: only here)

    spec = LlamaWidthSpec(width=32, depth=2, head_dim=16, vocab_size=48, context=16)
    data = torch.randint(0, spec.vocab_size, (40, spec.context), generator=torch.Generator().manual_seed(0))
    rank = dist.get_rank()
    # the gradient of one global batch of 8: one process against the mean of two slices of 4
    alone, shared = build_llama(spec, seed=2), build_llama(spec, seed=2)
    lm_loss(alone, data[:8]).backward()
    ddp = torch.nn.parallel.DistributedDataParallel(shared)
    lm_loss(ddp, data[4 * rank:4 * rank + 4]).backward()
    for (name, p), q in zip(alone.named_parameters(), shared.parameters()):
        _close(q.grad, p.grad, f"gradient of {name}", rtol=1e-5, atol=1e-7)
    del ddp
    # whole runs: checkpoints written by rank 0 alone, weights and losses as in one process
    config = dict(steps=9, batch_size=8, lr=1e-2, warmup_steps=2, checkpoint_every=3, checkpoint_steps=(0, 4, 9),
                  progress=False, seed=5)
    single = build_llama(spec, seed=3)
    reference = train(single, data, TrainConfig(**config))
    parallel = build_llama(spec, seed=3)
    result = train(parallel, data, TrainConfig(**config, checkpoint_dir=str(folder / "ddp")),
                   group=dist.group.WORLD)
    # AdamW divides by the root of the squared gradient's average, which magnifies the rounding of entries near 0:
    # allow a hundredth of one step's size (lr = 1e-2) where the gradients themselves agree to 1e-7.
    for (name, p), q in zip(single.named_parameters(), parallel.parameters()):
        _close(q.detach(), p.detach(), f"trained {name}", rtol=1e-4, atol=1e-4)
    worst = max(float((p - q).detach().abs().max()) for p, q in zip(single.parameters(), parallel.parameters()))
    print(f"rank {rank}: trained weights within {worst:.2g} of one process", flush=True)
    _close(torch.tensor([h["loss"] for h in result.history]), torch.tensor([h["loss"] for h in reference.history]),
           "loss history", rtol=1e-5, atol=1e-7)
    if sorted(list_checkpoints(folder / "ddp")) != [0, 4, 9] or sorted(result.checkpoints) != [0, 4, 9]:
        raise AssertionError(f"checkpoints {sorted(list_checkpoints(folder / 'ddp'))}")
    final = load_weights(build_llama(spec, seed=0), result.checkpoints[9])
    for (name, p), q in zip(final.named_parameters(), parallel.parameters()):
        _close(p.detach(), q.detach(), f"checkpointed {name}", rtol=0, atol=0)
    # the model is local again: a backward pass on one rank alone must not wait for the other
    if rank == 0:
        lm_loss(parallel, data[:4]).backward()
    dist.barrier()
    # a run that finished on two ranks is found finished by one process
    if rank == 0:
        again = train(build_llama(spec, seed=3), data, TrainConfig(**config, checkpoint_dir=str(folder / "ddp")))
        if again.resumed_from != 9:
            raise AssertionError(f"one process did not find the two-rank run finished: {again.resumed_from}")
    dist.barrier()
    # refused on every rank alike, before any collective: batch statistics, and a batch that does not split evenly
    points = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    normed = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    for model, batch_size, message in ((normed, 8, "BatchNorm"), (torch.nn.Linear(4, 4), 3, "equal slices")):
        try:
            train(model, points, TrainConfig(steps=1, batch_size=batch_size, progress=False),
                  loss_fn=lambda m, b: m(b).pow(2).mean(), group=dist.group.WORLD)
        except ValueError as err:
            if message not in str(err):
                raise
        else:
            raise AssertionError(f"data-parallel training did not refuse {message}")


def check_sharded_gram() -> None:
    """Each rank holds some rows (unequal shares): the geometry and the cross-Gram equal the one-shot ones."""
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(7)
    Q = torch.randn(41, 9, generator=generator, dtype=torch.float64) + 0.3
    test = torch.randn(30, 9, generator=generator, dtype=torch.float64) + 0.3
    mine = Q[:25] if rank == 0 else Q[25:]
    got, want = sharded.sharded_geometry(mine), estimate_geometry(Q)
    for name in ("n", "d", "mean_sq", "mean_sq_sq", "directional", "cov_energy", "d_par", "d_2", "d_align"):
        a, b = getattr(got, name), getattr(want, name)
        if abs(a - b) > 1e-10 * max(abs(b), 1e-12):
            raise AssertionError(f"sharded {name} {a!r} != one-shot {b!r}")
    for name, interval in want.intervals.items():
        other = got.intervals[name]
        if abs(other.se - interval.se) > 1e-9 * max(abs(interval.se), 1e-12):
            raise AssertionError(f"jackknife se of {name}: {other.se!r} != {interval.se!r}")
    test_mine = test[:10] if rank == 0 else test[10:]
    C = sharded.sharded_cross_gram(mine, test_mine)
    _close(C, cross_gram(Q, test), "cross-Gram", rtol=1e-12, atol=1e-12)
    _close(sharded.sharded_cross_gram(mine), cross_gram(Q), "Gram", rtol=1e-12, atol=1e-12)
    a = misalignment_probability(None, C=C, one_pool=False, M=4, K=4, trials=2000, seed=3)
    b = misalignment_probability(Q, test, M=4, K=4, trials=2000, seed=3)
    if a.p_misalign != b.p_misalign or abs(a.mean - b.mean) > 1e-12 * max(abs(b.mean), 1.0):
        raise AssertionError(f"misalignment on the gathered Gram {a} != {b}")


def checks(args) -> None:
    with distributed.session("cpu") as ctx:
        if ctx.world_size != 2:
            raise SystemExit("checks needs torchrun --nproc_per_node=2")
        folder = Path(distributed.broadcast(tempfile.mkdtemp(prefix="dalign-ddp-") if ctx.is_main else None))
        try:
            check_data_parallel(folder)
            check_sharded_gram()
            distributed.barrier()
        finally:
            if ctx.is_main:
                shutil.rmtree(folder, ignore_errors=True)
        if ctx.is_main:
            print("checks OK", flush=True)


def parse(argv=None):
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("sweep")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--ranks-per-job", default=None)
    run.add_argument("--kill-rank", type=int, default=None)
    run.add_argument("--kill-at-step", type=int, default=0)
    commands.add_parser("checks")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=f"[rank {distributed.context().rank}] %(message)s")
    arguments = parse()
    {"sweep": sweep, "checks": checks}[arguments.command](arguments)
