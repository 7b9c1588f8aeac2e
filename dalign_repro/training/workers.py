"""Every core, one thread each: a CPU process shares its job grid with forked workers.

Measured on a 2-core machine: a CPU sweep left at torch's default of one OpenMP
thread per core ran the LLaMA dry run 2.6x slower (ResNet 4x) under any other load
than with one thread, and idle, two threads were only 1.6-1.8x faster than one. Small
models do not split well over threads; independent jobs split perfectly over
processes. So on the CPU every process computes with **one** intra-op thread
(:func:`dalign_core.device.configure`), and :func:`dalign_repro.training.distributed.run_jobs` in a world of one
(no torchrun) runs the job grid on **one worker per core** (:func:`count`), each a
forked copy of the process (data loaded once, shared copy-on-write; the ``compute``
closure needs no pickling).

The workers take the jobs in the order of :func:`dalign_repro.training.distributed.plan` — the
order torchrun's ranks follow: longest first — each job going to the worker that
frees up first (the plan's rule, with the real finishing times instead of the
projected ones). Each worker writes a finished job into the jobs folder atomically,
as a rank would; the parent calls ``finished`` as each job comes in and reads every
result back at the end, so ``run_jobs`` returns what a single process returns. Every
job is computed from its own seeds on one thread, so the results do not depend on the
number of workers, nor on which worker ran a job: bit for bit.

A job that raises is reported with its name and the worker's traceback (logged at
once, raised once every worker is done: the other jobs go on, as each is independent
and kept); a worker that dies (killed, out of memory) is reported with the job it was
computing and never leaves the parent waiting; a parent that dies (even by ``kill -9``)
takes its workers with it. ``KeyboardInterrupt`` (Ctrl-C) stops
the workers; the finished jobs stay in the folder and the same command resumes.

Settings (environment variables):

* ``DALIGN_WORKERS`` — worker processes (default: the usable cores, see :func:`cores`,
  divided by the threads per process); ``1`` is a single process, as before.
* ``DALIGN_THREADS`` — intra-op threads per process on the CPU (default 1; read and set by
  :mod:`dalign_core.device`, where the device is resolved). More than
  one runs a single process: a forked child of a process that has used OpenMP's thread
  pool hangs in its first parallel region, so workers always compute on one thread.

On a GPU nothing changes: no thread setting, no workers (and never after CUDA was
initialized: a forked child cannot use it). Under torchrun every rank is a process of
one thread on the CPU and the ranks share the grid as before. The thread count and
the workers go into every results table's provenance (:func:`settings`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from dalign_core.device import THREADS_VARIABLE, positive_env_int, configured, threads

__all__ = ["WORKERS_VARIABLE", "WorkerError", "GridProgress", "cores", "count", "settings", "reset", "recorded",
           "restore", "record_reused", "reused", "run_pool"]

log = logging.getLogger(__name__)

WORKERS_VARIABLE = "DALIGN_WORKERS"
INTERRUPTED = "interrupted; rerun the same command to resume"

_state: dict[str, Any] = {"workers": 1, "in_worker": False, "reused": [0, 0]}


class WorkerError(RuntimeError):
    """One or more jobs failed in worker processes (the message names each job and quotes its traceback)."""

    def __init__(self, message: str, failures: list[dict[str, Any]]):
        super().__init__(message)
        self.failures = failures


# ----------------------------------------------------------------------------- how many processes


def cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a container's limit)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            usable = min(usable, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(usable, 1)


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def count() -> int:
    """Worker processes for a job grid of this process: 1 on a GPU; else ``$DALIGN_WORKERS`` or one per core.

    The default (without ``$DALIGN_WORKERS``) applies once :func:`dalign_core.device.configure` was told the
    CPU (the experiment runner and :func:`dalign_repro.training.distributed.init` do it); before
    that a job grid runs in this process, as it always did.
    """
    device = configured()
    if _state["in_worker"] or (device is not None and device.type != "cpu") or _cuda_in_use():
        return 1  # a worker's own job grids stay in the worker
    asked, per_process = positive_env_int(WORKERS_VARIABLE), threads()
    if asked is not None and asked > 1 and per_process > 1:
        raise ValueError(f"{WORKERS_VARIABLE}={asked} with {THREADS_VARIABLE}={per_process}: workers compute on one "
                         f"thread each (a forked process cannot run OpenMP on more); choose {WORKERS_VARIABLE}=1 "
                         f"for one process of {per_process} threads, or leave {THREADS_VARIABLE} unset")
    if asked is not None:
        return asked
    if device is None or per_process > 1:
        return 1
    return cores()


def reset() -> None:
    """Forget the workers recorded so far (the runner calls it before an experiment computes)."""
    _state["workers"], _state["reused"] = 1, [0, 0]


def recorded() -> dict[str, Any]:
    """What this experiment has recorded so far (workers, reused jobs), for :func:`restore`."""
    return {"workers": _state["workers"], "reused": list(_state["reused"])}


def restore(record: dict[str, Any]) -> None:
    """Put back what :func:`recorded` returned: an experiment run inside another (a study's sweep) leaves the
    outer one's record as it found it."""
    _state["workers"], _state["reused"] = record["workers"], list(record["reused"])


def record_reused(reused: int, jobs: int) -> None:
    """Note that a job grid of this experiment found ``reused`` of its ``jobs`` already finished (an interrupted
    run's): the results' wall time then covers only the rest."""
    _state["reused"] = [_state["reused"][0] + int(reused), _state["reused"][1] + int(jobs)]


def reused() -> dict[str, int] | None:
    """``{"jobs_reused": r, "jobs": n}`` when this experiment resumed an interrupted run (r > 0), else None."""
    r, n = _state["reused"]
    return {"jobs_reused": r, "jobs": n} if r else None


def record(workers: int) -> None:
    """Note that a job grid of this experiment ran on ``workers`` processes (the provenance keeps the largest)."""
    _state["workers"] = max(_state["workers"], int(workers))


def settings() -> dict[str, Any]:
    """What the provenance keeps: threads per process (intra-op, inter-op) and the worker processes of the job grid."""
    return {"threads_per_process": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "workers": _state["workers"]}


# ----------------------------------------------------------------------------- the pool


class GridProgress:
    """``job k of N`` lines with the time taken and an estimate of the time left, for a job grid's log.

    The estimate scales the time so far by the planned cost still to come (:attr:`Job.cost`, relative
    costs), so a grid whose widest models come first does not promise too early an end."""

    def __init__(self, jobs: Sequence, label: str = "job"):
        self.total, self.label = len(jobs), label
        self.costs = {job.name: max(float(getattr(job, "cost", 1.0)), 0.0) for job in jobs}
        self.total_cost = sum(self.costs.values()) or float(self.total)
        self.done, self.done_cost = 0, 0.0
        self.started = time.monotonic()

    def finished(self, name: str) -> str:
        """Count job ``name`` as done; return its line, e.g. ``job 3 of 16 done (N32_seed0): 4.1 min in, about
        12 min left``."""
        self.done += 1
        self.done_cost += self.costs.get(name, 1.0) if self.costs else 1.0
        elapsed = time.monotonic() - self.started
        left = self.total_cost - self.done_cost
        estimate = (f", about {_duration(elapsed * left / self.done_cost)} left"
                    if self.done < self.total and self.done_cost > 0 else "")
        return f"{self.label} {self.done} of {self.total} done ({name}): {_duration(elapsed)} in{estimate}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"



PR_SET_PDEATHSIG = 1
"""prctl(2)'s option that sends this process a signal when its parent dies (Linux)."""
WATCHDOG_SECONDS = 1.0
"""How often a worker's watchdog thread checks that its parent is alive (the portable fallback)."""


def _die_with_parent(parent_pid: int) -> None:
    """End this worker when the process that forked it dies, even by ``kill -9`` (which runs no cleanup).

    A worker blocked on its pipe would not notice: its siblings inherited the parent's ends of
    the other pipes, so no end-of-file ever comes, and a worker inside a job reads no pipe at
    all. On Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` has the kernel kill it at once; everywhere,
    a daemon thread checks every :data:`WATCHDOG_SECONDS` that the parent is still this
    process's parent (an orphan is re-parented) and ends the process if not. A finished job
    is already on disk (written atomically), so nothing is lost that a rerun does not redo.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc to ask: the watchdog alone
            pass
    if os.getppid() != parent_pid:  # the parent died between the fork and the prctl
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_SECONDS)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="dalign-parent-watchdog", daemon=True).start()


def _worker(index: int, conn, order: Sequence, compute: Callable, store, parent_pid: int | None = None) -> None:
    """A forked worker: take job numbers from the parent until it sends None; report each job done or failed.

    It exits when its parent dies (:func:`_die_with_parent`)."""
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers
    _state["in_worker"] = True
    torch.set_num_threads(1)
    conn.send(("ready", None, None))
    while True:
        number = conn.recv()
        if number is None:
            break
        job = order[number]
        try:
            result = compute(job, None)
            if store.folder is not None:
                store.put(job.name, result)  # atomically, as a rank would; the parent reads it back
                conn.send(("done", number, None))
            else:
                conn.send(("done", number, result))
        except BaseException as err:  # noqa: BLE001  (reported to the parent, which raises)
            conn.send(("failed", number, dict(kind=type(err).__name__, interrupt=isinstance(err, KeyboardInterrupt),
                                              traceback=traceback.format_exc())))
    conn.close()


def _stop(processes) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()


class _Pool:
    """:func:`run_pool`'s forked workers as the parent sees them: which job each computes, which are alive, and
    what failed. Each worker says it is ready, then asks for the next job (in plan order) by finishing one."""

    def __init__(self, order: list, compute: Callable, store, workers: int, finished: Callable | None):
        self.order, self.store, self.finished = order, store, finished
        context = multiprocessing.get_context("fork")
        self.processes, self.conns = [], []
        for index in range(workers):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_worker, args=(index, child_end, order, compute, store, os.getpid()),
                                      name=f"dalign-worker-{index}")
            process.start()
            child_end.close()
            self.processes.append(process)
            self.conns.append(parent_end)
        log.info("%d job(s) on %d worker processes of one thread each", len(order), workers)
        self.current: dict[int, int | None] = dict.fromkeys(range(workers))
        self.alive = set(range(workers))
        self.failures: list[dict[str, Any]] = []
        self.following = 0
        self.progress = GridProgress(order)

    def dispatch(self, index: int) -> None:
        """Send worker ``index`` the next job's number (None: no job left, the worker exits)."""
        number = self.following if self.following < len(self.order) else None
        self.following += number is not None
        self.current[index] = number
        try:
            self.conns[index].send(number)
        except OSError:  # the worker is gone; its sentinel reports it
            pass

    def handle(self, index: int, message) -> None:
        """Take worker ``index``'s message (ready, done with a result, or failed with a traceback) and give it the
        next job."""
        kind, number, payload = message
        if kind == "done":
            job = self.order[number]
            if self.store.folder is None:
                self.store.put(job.name, payload)
            log.info("%s", self.progress.finished(job.name))
            if self.finished is not None:
                self.finished(job, self.store.get)
        elif kind == "failed":
            job = self.order[number]
            self.failures.append(dict(job=job.name, worker=index, **payload))
            log.error("job %s failed in worker %d:\n%s", job.name, index, payload["traceback"].rstrip())
        self.current[index] = None
        self.dispatch(index)

    def reap(self, index: int) -> None:
        """Worker ``index`` has exited (or closed its pipe): once it is gone, record the job it died in, if any."""
        process = self.processes[index]
        process.join(timeout=10)
        if process.is_alive():
            return  # closed its pipe, still exiting: its sentinel comes round again
        self.alive.discard(index)
        if self.current[index] is not None:
            code = process.exitcode
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            job = self.order[self.current[index]]
            self.failures.append(dict(job=job.name, worker=index, kind="WorkerDied", interrupt=False,
                                      traceback=f"worker {index} died ({how}) while computing job {job.name}"))
            log.error("worker %d died (%s) while computing job %s", index, how, job.name)

    def serve(self) -> None:
        """Answer the workers until every one has exited."""
        while self.alive:
            waiting = {self.conns[i]: i for i in self.alive}
            sentinels = {self.processes[i].sentinel: i for i in self.alive}
            for ready in multiprocessing.connection.wait(list(waiting) + list(sentinels)):
                index = waiting.get(ready, sentinels.get(ready))
                if index not in self.alive:
                    continue
                try:
                    while self.conns[index].poll():
                        self.handle(index, self.conns[index].recv())
                except (EOFError, OSError):
                    pass
                if ready in sentinels or not self.processes[index].is_alive():
                    self.reap(index)

    def unstarted(self) -> list[dict[str, Any]]:
        """A failure for each job never handed out (every worker died first)."""
        return [dict(job=job.name, worker=None, kind="NotRun", interrupt=False,
                     traceback=f"job {job.name} was never started: every worker had died")
                for job in self.order[self.following:]]


def _raise_failures(failures: list[dict[str, Any]], store) -> None:
    """Raise KeyboardInterrupt if a job was interrupted, else :class:`WorkerError` naming every failed job."""
    if any(failure["interrupt"] for failure in failures):
        raise KeyboardInterrupt(f"{INTERRUPTED} (a job was interrupted: {', '.join(f['job'] for f in failures)})")
    names = [failure["job"] for failure in failures]
    details = "\n\n".join(f"job {f['job']} ({f['kind']}, worker {f['worker']}):\n{f['traceback'].rstrip()}"
                          for f in failures)
    kept = " (the finished jobs are kept: rerun the same command to compute the rest)" if store.folder else ""
    raise WorkerError(f"{len(failures)} job(s) failed: {', '.join(names)}{kept}\n\n{details}", failures)


def run_pool(jobs: Sequence, compute: Callable, store, workers: int,
             finished: Callable | None = None) -> None:
    """Compute ``jobs`` (in the order given: the plan's) on ``workers`` forked processes into ``store``.

    ``store``: :class:`dalign_repro.training.distributed._Store` (a folder, or memory when its
    folder is None: results then come back through the pipe). ``finished(job, store.get)``
    runs here, in the parent, as each job comes in. Raises :class:`WorkerError` naming
    every job that failed or whose worker died, ``KeyboardInterrupt`` after Ctrl-C (or
    when a job itself raised it), once the workers have stopped.
    """
    order = [dataclasses.replace(job, ranks=1) if job.ranks != 1 else job for job in jobs]
    torch.set_num_threads(1)  # before the fork: a child of a process with a live OpenMP pool of more threads hangs
    # A job that trains builds an optimizer, whose first add_param_group imports torch._dynamo (about 900 modules,
    # 1.8 s of CPU on a 2-core AVX2 EPYC): imported once here, the forked workers inherit it instead of each
    # importing it again, in every pool.
    importlib.import_module("torch._dynamo")
    pool = _Pool(order, compute, store, min(workers, len(order)), finished)
    try:
        pool.serve()
    except BaseException as err:
        _stop(pool.processes)
        if isinstance(err, KeyboardInterrupt):
            kept = f"the finished jobs are kept in {store.folder}" if store.folder is not None else "nothing is kept"
            raise KeyboardInterrupt(f"{INTERRUPTED} ({kept})") from None
        raise
    finally:
        for conn in pool.conns:
            conn.close()
    for process in pool.processes:
        process.join()
    failures = pool.failures + pool.unstarted()
    if failures:
        _raise_failures(failures, store)


def hardware() -> dict[str, Any]:
    """The machine, and how this process used it: ``threads_per_process`` (torch's intra-op
    threads), ``interop_threads``, and ``workers``, the processes that shared the job grid
    (1: this process alone)."""
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "usable_cores": cores(),
        "torch_threads": torch.get_num_threads(),
        **settings(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info
