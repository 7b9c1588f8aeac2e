"""Several processes, one experiment: torchrun's process group, and the job grid its ranks share.

Nothing here is a framework of its own: it is ``torch.distributed`` as ``torchrun``
starts it (the ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and
``GROUP_RANK`` variables), so one node of 8 GPUs and a Slurm cluster (``srun`` starting
one ``torchrun`` per node) run the same command. A plain ``python -m ...`` is a world of
one: every function below then does its work in this process and never touches a
process group. Where a rank computes (its :func:`~dalign_core.device.context`
and its device) is :mod:`dalign_core.device`'s; the rows of one q pool spread
over the ranks are :mod:`dalign_repro.training.sharded`'s.

**Process group.** :func:`init` joins the group torchrun describes (idempotent; NCCL
when the experiment runs on CUDA, gloo on the CPU) and pins the rank to its local
device, ``cuda:<LOCAL_RANK>`` (:func:`dalign_core.device.local_device`). Barriers and small Python objects
(which jobs are done, each rank's hardware) go through a gloo group even beside NCCL,
so a rank that waits hours for the others' jobs holds no GPU stream; its timeout is
``DALIGN_DIST_TIMEOUT_H`` hours (default 72). :func:`shutdown` leaves the group;
:func:`session` wraps both around a command.

**The job grid.** An experiment is a list of independent :class:`Job` s, each with a
name, a cost (any unit: only ratios matter) and the number of ranks it needs.
:func:`run_jobs` lets rank 0 list the jobs already finished in the shared jobs folder
and tell the others (so every rank agrees), then every rank computes the same
:func:`plan` — longest job first, each onto the block of consecutive ranks that frees up
first — and runs its own jobs in that plan's order. The plan is one total order that
every rank follows, so jobs of several ranks never wait on each other in a cycle.
Each finished job's result is written by its first rank as ``<folder>/<name>.json``
(atomically: :mod:`dalign_core.atomic`), and the call ends with a barrier, after which
any rank can read every result. A rerun lists the folder again and plans only what is
missing: after a rank or a node dies (torchrun then stops the others), the same command
finishes the rest, and since every job is computed from its own seeds alone, the
tables equal those of an uninterrupted run. A job file that cannot be used (truncated,
not JSON, emptied to ``{}``, of the wrong shape: :func:`job_result_problem`) is logged
as ``damaged job file <path>: recomputing`` and its job computed again, never reused.
The folder (and the training checkpoints) must be on a filesystem every rank sees;
:func:`check_shared` says so at once when it is not. :func:`remove_jobs` removes the
folder once the tables are written, and ``<out>/partial`` with it when that is empty.

**Workers.** A world of one on the CPU shares the grid too: :func:`run_jobs` forks one
worker process of one thread per core (:mod:`dalign_repro.training.workers`; ``DALIGN_WORKERS``),
which take the jobs in the plan's order and keep them in the folder as ranks would.
Every CPU process — rank, worker or plain — computes on one thread, so the results do
not depend on how many there are.

**Job groups.** A job of ``ranks > 1`` gets a process group of its ranks (created once
per block, collectively, by :func:`job_group`); the sweep hands it to
:func:`dalign_repro.training.loop.train`, which runs DistributedDataParallel over it: each
rank takes its slice of the same global batch, so the averaged gradient is the
single-process gradient of that batch (to float rounding). :func:`ranks_per_job` reads
which widths get how many ranks (``DALIGN_RANKS_PER_JOB``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import platform
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from dalign_core.atomic import atomic_write_text
from dalign_repro.training import workers as _workers
from dalign_core.device import Context, configure, context, local_device  # callers use distributed.context

__all__ = ["init", "shutdown", "session", "barrier", "broadcast", "all_gather", "main_first", "hardware",
           "check_shared", "Job", "Assignment", "plan", "job_group", "ranks_per_job", "run_jobs", "remove_jobs",
           "job_result_problem", "RANKS_PER_JOB_VARIABLE", "is_active"]

log = logging.getLogger(__name__)

RANKS_PER_JOB_VARIABLE = "DALIGN_RANKS_PER_JOB"
TIMEOUT_VARIABLE = "DALIGN_DIST_TIMEOUT_H"

_state: dict[str, Any] = {"owned": False, "coordination": None, "groups": {}}


# ----------------------------------------------------------------------------- the process group


def _timeout() -> datetime.timedelta:
    return datetime.timedelta(hours=float(os.environ.get(TIMEOUT_VARIABLE, "72")))


def init(device: str = "auto") -> Context:
    """Join the process group torchrun describes (once per process); a world of one returns at once.

    NCCL when ``device`` resolves to CUDA (after pinning this rank to its local GPU),
    gloo otherwise; barriers and objects use a gloo group either way. In any world, a
    process computing on the CPU is set to one thread (:func:`dalign_core.device.configure`).
    """
    ctx = context()
    configure(device)  # on the CPU: one thread per process
    if not ctx.distributed or dist.is_initialized():
        return ctx
    target = local_device(device)
    if target.type == "cuda":
        torch.cuda.set_device(target)
    backend = "nccl" if target.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=_timeout())
    _state.update(owned=True, groups={},
                  coordination=dist.new_group(backend="gloo", timeout=_timeout()) if backend != "gloo" else None)
    log.info("rank %d of %d (node %d, local rank %d) joined the %s group on %s", ctx.rank, ctx.world_size,
             ctx.node, ctx.local_rank, backend, target)
    return ctx


def shutdown() -> None:
    """Leave the process group if :func:`init` joined it (a no-op otherwise)."""
    if _state["owned"] and dist.is_initialized():
        dist.destroy_process_group()
    _state.update(owned=False, coordination=None, groups={})


@contextlib.contextmanager
def session(device: str = "auto") -> Iterator[Context]:
    """:func:`init` for the block, :func:`shutdown` after it (the ``python -m`` entry points use it)."""
    ctx = init(device)
    try:
        yield ctx
    finally:
        shutdown()


def is_active() -> bool:
    """True inside a torchrun job whose process group is up (collectives then reach the other ranks)."""
    return context().distributed and dist.is_initialized()


def _coordination():
    return _state["coordination"]  # None: the default (gloo) group


# ----------------------------------------------------------------------------- collectives on Python objects


def barrier() -> None:
    """Wait for every rank (a no-op in a world of one)."""
    if is_active():
        dist.barrier(group=_coordination())


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (pickled; for small objects)."""
    if not is_active():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=_coordination())
    return box[0]


def all_gather(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order (pickled; for small objects)."""
    if not is_active():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value, group=_coordination())
    return out


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (fills caches: a tokenizer, a download), then the others run it."""
    ctx = context()
    if ctx.distributed and not ctx.is_main:
        barrier()
    yield
    if ctx.distributed and ctx.is_main:
        barrier()


def hardware() -> list[dict[str, Any]]:
    """Every rank's host, device and hardware, in rank order (a list of one in a world of one)."""

    ctx = context()
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    mine = dict(rank=ctx.rank, local_rank=ctx.local_rank, node=ctx.node, host=socket.gethostname(),
                device=(torch.cuda.get_device_name(device) if device is not None else platform.processor() or "cpu"),
                **_workers.hardware())
    return all_gather(mine)


def check_shared(folder: str | os.PathLike) -> None:
    """Raise on every rank unless every rank sees ``folder`` as the same folder (a filesystem they share)."""
    if not is_active():
        return
    folder = Path(folder)
    marker = folder / f".shared-{os.getpid()}-{socket.gethostname()}"
    if context().is_main:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(marker, "rank 0 wrote this\n")
    name = broadcast(marker.name)
    barrier()
    seen = all_gather((folder / name).is_file())
    barrier()
    if context().is_main:
        (folder / name).unlink(missing_ok=True)
    blind = [rank for rank, ok in enumerate(seen) if not ok]
    if blind:
        raise RuntimeError(f"ranks {blind} do not see {folder} as rank 0 does: the jobs folder and the checkpoints "
                           "must be on a filesystem every node shares (set --out and DALIGN_CHECKPOINTS to one)")


# ----------------------------------------------------------------------------- the job grid


@dataclass(frozen=True)
class Job:
    """One independent piece of an experiment: its result is kept as ``<folder>/<name>.json``."""

    name: str
    cost: float = 1.0
    """Relative cost on one rank (only ratios matter: it balances the plan, never changes a result)."""
    ranks: int = 1
    """Ranks that compute it together (a job group: data-parallel training)."""
    payload: Any = None
    """Whatever the compute function needs to know (the width, the seed)."""


@dataclass(frozen=True)
class Assignment:
    """A job placed on ranks ``ranks`` over the projected interval ``[start, end)`` (in cost units)."""

    job: Job
    ranks: tuple[int, ...]
    start: float
    end: float


def plan(jobs: Sequence[Job], world_size: int, speedup: Callable[[int], float] | None = None) -> list[Assignment]:
    """Place every job on a block of consecutive ranks: longest first, onto the block that frees up first.

    A job of ``ranks = g`` takes one of the blocks ``[0, g), [g, 2g), ...`` (g divides the
    world size) and lasts ``cost / speedup(g)`` (default ``speedup(g) = g``). The result is
    in the order every rank must follow; it depends only on the arguments, so all ranks
    compute the same plan. ``max(a.end for a in plan)`` is the projected wall time.
    """
    speedup = speedup or (lambda g: float(g))
    free = [0.0] * world_size
    out = []
    for job in sorted(jobs, key=lambda j: (-j.cost, j.name)):
        g = job.ranks
        if g < 1 or world_size % g:
            raise ValueError(f"job {job.name} asks for {g} ranks; a job group must divide the world size {world_size}")
        start = min(range(0, world_size, g), key=lambda s: (max(free[s:s + g]), s))
        begin = max(free[start:start + g])
        end = begin + job.cost / speedup(g)
        free[start:start + g] = [end] * g
        out.append(Assignment(job, tuple(range(start, start + g)), begin, end))
    return out


def job_group(ranks: tuple[int, ...]):
    """The process group of the ranks ``ranks`` (None for one rank); every rank must ask for the same blocks in turn.

    ``torch.distributed.new_group`` is collective over the whole world, so the groups of
    one block size are created together, once, in the same order on every rank.
    """
    if len(ranks) == 1:
        return None
    size = len(ranks)
    if size not in {key[1] for key in _state["groups"]}:
        for start in range(0, dist.get_world_size(), size):
            _state["groups"][(start, size)] = dist.new_group(list(range(start, start + size)), timeout=_timeout())
    return _state["groups"][(ranks[0], size)]


def ranks_per_job(widths: Sequence[int], world_size: int, spec: str | int | None = None) -> dict[int, int]:
    """How many ranks train each width together: ``spec`` or ``$DALIGN_RANKS_PER_JOB``.

    ``"2"`` puts two ranks on every width; ``"2560:2,3072:4"`` two on widths from 2560,
    four from 3072, one below. A group must divide the world size; in a world of one
    every width gets one rank, whatever the spec.
    """
    spec = os.environ.get(RANKS_PER_JOB_VARIABLE, "") if spec is None else spec
    sizes = {width: 1 for width in widths}
    if world_size == 1 or spec in ("", None):
        return sizes
    text = str(spec).replace(" ", "")
    try:
        if ":" not in text:
            thresholds = [(0, int(text))]
        else:
            thresholds = sorted((int(w), int(g)) for w, g in (part.split(":") for part in text.split(",") if part))
    except ValueError:
        raise ValueError(f"{RANKS_PER_JOB_VARIABLE}={spec!r}: give a number of ranks ('2') or width:ranks pairs "
                         "('2560:2,3072:4')") from None
    for width in widths:
        for threshold, g in thresholds:
            if width >= threshold:
                sizes[width] = g
    bad = sorted({g for g in sizes.values() if g < 1 or world_size % g})
    if bad:
        raise ValueError(f"{RANKS_PER_JOB_VARIABLE}={spec!r}: {bad} rank(s) per job do not divide the world size "
                         f"{world_size}")
    return sizes


_RATE_TRIAL = re.compile(r"(lr|full)_N\d+_lr\S+")
_MEASURED_RUN = re.compile(r"N\d+_seed\d+")


def job_result_problem(name: str, result: Any) -> str | None:
    """What makes ``result`` unusable as job ``name``'s kept result (None when it is usable).

    A result is a non-empty JSON value. The width sweeps' jobs (:mod:`dalign_repro.sweep.run`)
    have a shape of their own, read from the name: a rate trial (``lr_N<width>_lr<rate>``,
    ``full_N<width>_lr<rate>``) is an object with a numeric ``validation_loss``; a measured
    run (``N<width>_seed<seed>``) is an object of table name → list of row objects that
    includes a non-empty ``runs``. Any object that carries ``validation_loss`` or ``runs``
    is held to the same shape.
    """
    if result is None or (isinstance(result, (dict, list, str)) and not result):
        return f"it holds {json.dumps(result)}, no result"
    trial = _RATE_TRIAL.fullmatch(name) or (isinstance(result, dict) and "validation_loss" in result)
    run = _MEASURED_RUN.fullmatch(name) or (isinstance(result, dict) and "runs" in result)
    if (trial or run) and not isinstance(result, dict):
        return f"it holds a {type(result).__name__}, not an object"
    if trial:
        loss = result.get("validation_loss", "missing")
        if isinstance(loss, bool) or not isinstance(loss, (int, float)):
            return f"a rate trial needs a numeric validation_loss, found {json.dumps(loss)[:40]}"
    if run:
        bad = sorted(str(k) for k, rows in result.items()
                     if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows))
        if bad:
            return f"a measured run is table name -> list of rows; {', '.join(bad[:5])} is not"
        if not result.get("runs"):
            return "a measured run needs its 'runs' row"
    return None


class _Store:
    """Finished jobs' results: in ``folder`` (one JSON file each) or, without one, in memory.

    A file that is not a usable result (:func:`job_result_problem`: damaged, truncated,
    emptied to ``{}``, of the wrong shape) is logged with its path and counts as missing,
    so the job is computed again and the file replaced; it is never reused.
    """

    def __init__(self, folder: Path | None):
        self.folder, self.memory = folder, {}
        self._reported: set[Path] = set()

    def names(self) -> set[str]:
        """The jobs whose kept result is usable."""
        if self.folder is None:
            return set(self.memory)
        if not self.folder.is_dir():
            return set()
        return {p.stem for p in self.folder.glob("*.json") if self._read(p) is not None}

    def get(self, name: str) -> Any:
        """Job ``name``'s kept result; None when there is none or its file is damaged (logged)."""
        if self.folder is None:
            return self.memory.get(name)
        path = self.folder / f"{name}.json"
        return self._read(path) if path.is_file() else None

    def _read(self, path: Path) -> Any:
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            problem = f"{type(err).__name__}: {err}"
        else:
            problem = job_result_problem(path.stem, result)
            if problem is None:
                return result
        if path not in self._reported:
            self._reported.add(path)
            log.warning("damaged job file %s: recomputing (%s)", path, problem)
        return None

    def put(self, name: str, result: Any) -> Any:
        if self.folder is None:
            self.memory[name] = result
            return result
        text = json.dumps(result, default=float)
        kept = json.loads(text)  # what any rank reads back: the same on every rank
        problem = job_result_problem(name, kept)
        if problem is not None:
            raise ValueError(f"job {name} computed a result that cannot be kept ({problem})")
        atomic_write_text(self.folder / f"{name}.json", text)
        self._reported.discard(self.folder / f"{name}.json")
        return kept


def remove_jobs(folder: str | os.PathLike | None) -> None:
    """Remove a finished experiment's jobs folder, and its parent (``<out>/partial``) when that is left empty."""
    if folder is None:
        return
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty (another experiment's jobs), or gone already
        folder.parent.rmdir()


def _read_all(store: _Store, jobs: Sequence[Job], hint: str = "") -> dict[str, Any]:
    """Every job's kept result; raises RuntimeError naming the jobs that left none (``hint`` says where to look)."""
    results = {job.name: store.get(job.name) for job in jobs}
    missing = [name for name, result in results.items() if result is None]
    if missing:
        raise RuntimeError(f"jobs {missing} left no result in {store.folder}{hint}")
    return results


def _on_workers(store: _Store, jobs: Sequence[Job], todo: list[Job], compute: Callable, finished: Callable | None,
                speedup: Callable[[int], float] | None, count: int) -> dict[str, Any]:
    """The jobs ``todo`` (of ``jobs``) on ``count`` forked worker processes of one rank each, in :func:`plan`'s
    order; every job's result."""
    _workers.record_reused(len(jobs) - len(todo), len(jobs))
    if len(todo) < len(jobs):
        log.info("reusing %d finished job(s) of %d", len(jobs) - len(todo), len(jobs))
    single = [dataclasses.replace(job, ranks=1) for job in todo]  # a worker is one rank
    _workers.run_pool([a.job for a in plan(single, count, speedup)], compute, store, count, finished)
    return _read_all(store, jobs)


def _one_after_another(store: _Store, jobs: Sequence[Job], compute: Callable,
                       finished: Callable | None) -> dict[str, Any]:
    """The jobs not yet kept computed here, one after another in the order given; every job's result."""
    results = {}
    kept = {job.name: store.get(job.name) for job in jobs}
    _workers.record_reused(sum(v is not None for v in kept.values()), len(jobs))
    progress = _workers.GridProgress([job for job in jobs if kept[job.name] is None])
    for job in jobs:
        done = kept[job.name]
        if done is not None:
            log.info("reusing the finished job %s", job.name)
        else:
            done = store.put(job.name, compute(job, None))
            log.info("%s", progress.finished(job.name))
            if finished is not None:
                finished(job, store.get)
        results[job.name] = done
    return results


def _on_ranks(store: _Store, jobs: Sequence[Job], compute: Callable, finished: Callable | None,
              speedup: Callable[[int], float] | None, collect: str) -> dict[str, Any]:
    """Under torchrun: the jobs not yet kept, each on the block of ranks :func:`plan` gives it, the results shared
    through ``store``'s folder; every job's result (an empty dict on ranks other than 0 with ``collect="main"``)."""
    ctx = context()
    check_shared(store.folder)
    done = broadcast(sorted(store.names()) if ctx.is_main else None)
    todo = [job for job in jobs if job.name not in set(done)]
    _workers.record_reused(len(jobs) - len(todo), len(jobs))
    if ctx.is_main and len(todo) < len(jobs):
        log.info("reusing %d finished job(s) of %d", len(jobs) - len(todo), len(jobs))
    assignments = plan(todo, ctx.world_size, speedup)
    for size in sorted({a.job.ranks for a in assignments if a.job.ranks > 1}):
        job_group(tuple(range(size)))  # every rank creates every block's group, in the same order
    mine = _workers.GridProgress([a.job for a in assignments if a.ranks[0] == ctx.rank], label="its job")
    for assignment in assignments:
        if ctx.rank not in assignment.ranks:
            continue
        job = assignment.job
        log.info("rank %d: job %s%s", ctx.rank, job.name,
                 f" with ranks {list(assignment.ranks)}" if len(assignment.ranks) > 1 else "")
        result = compute(job, job_group(assignment.ranks))
        if ctx.rank == assignment.ranks[0]:
            store.put(job.name, result)
            log.info("rank %d: %s", ctx.rank, mine.finished(job.name))
            if finished is not None:
                finished(job, store.get)
    barrier()
    if collect == "main" and not ctx.is_main:
        return {}
    return _read_all(store, jobs, "; is it on a filesystem every rank shares?")


def run_jobs(folder: str | os.PathLike | None, jobs: Sequence[Job], compute: Callable[[Job, Any], Any], *,
             collect: str = "all", finished: Callable[[Job, Callable[[str], Any]], None] | None = None,
             speedup: Callable[[int], float] | None = None, workers: int | None = None,
             local: bool = False) -> dict[str, Any]:
    """Every job's result (JSON-able), computing only those not already in ``folder``; see the module docstring.

    ``compute(job, group)`` runs on each of the job's ranks with the job's process group
    (None for a one-rank job); the first rank's return value is kept. ``finished(job,
    lookup)`` runs on that rank after the result is kept; ``lookup(name)`` reads any kept
    result (None if not there yet). ``collect="main"`` reads the results on rank 0 only
    (the others get an empty dict). Without ``folder`` (a world of one only) nothing is
    kept on disk.

    In a world of one on the CPU the jobs run on ``workers`` forked processes of one
    thread each (default :func:`dalign_repro.training.workers.count`: ``$DALIGN_WORKERS``, else one
    per core), in the order of :func:`plan`, each job on one process; ``finished`` then
    runs in this process as each job comes in. ``workers=1`` computes them here, one
    after another, in the order given. The results are the same either way.

    ``local=True``: this process computes every job as in a world of one, under torchrun
    too (an experiment that runs on rank 0 alone must not wait for the other ranks).
    """
    ctx = context()
    store = _Store(Path(folder) if folder is not None else None)
    if ctx.distributed and store.folder is None and not local:
        raise ValueError("ranks share their finished jobs through a folder on a shared filesystem: pass one")
    if ctx.distributed and not local:
        return _on_ranks(store, jobs, compute, finished, speedup, collect)
    count = _workers.count() if workers is None else int(workers)
    _workers.record(count)
    if count > 1:
        done = store.names()
        todo = [job for job in jobs if job.name not in done]
        if 1 < len(todo):
            return _on_workers(store, jobs, todo, compute, finished, speedup, count)
    return _one_after_another(store, jobs, compute, finished)
