"""One convention for every experiment: skip if current, time, write the tables, and the ``python -m`` entry.

An experiment module defines a ``Config`` (an :class:`~dalign_core.config.ExperimentConfig`
with profiles), the names of its tables, and a ``compute(config, out_dir)`` that returns them::

    def run(config, out_dir=None, force=False):
        return run_experiment("theory", TABLES, config, compute, out_dir=out_dir, force=force)

    if __name__ == "__main__":
        main(Config, run)

:func:`run_experiment` skips the work when every table exists with a provenance of
the same config hash (``force=True`` recomputes), times ``compute``, and writes each
table with its provenance JSON (written last, so its presence means the CSV is
complete). Messages go to the ``dalign`` logger: the command line shows them, a
notebook stays quiet.

A config changed from its profile's (``--set field=value`` on the command line,
``Config.for_profile(profile, **overrides)`` in a notebook) writes to a folder of its own,
``results/<profile>+<hash of the changes>/`` (:func:`dalign_core.config.default_results_dir`),
never into the profile's: asked for ``results/<profile>`` with a changed config,
:func:`run_experiment` goes to that folder instead and says so, and records the changes in
its ``overrides.json``. An explicit other folder (``--out``) is used as given.

Under ``torchrun`` (:mod:`dalign_core.distributed`) an experiment whose ``compute``
shares its jobs over the ranks (``sharded=True``: the width sweeps) runs on every rank
and rank 0 writes the tables, with the world size and every rank's hardware in the
provenance; any other experiment runs on rank 0 alone. Without torchrun it is a world of
one.

On the CPU every process computes on one thread (``$DALIGN_THREADS`` to change it), and
a world of one runs its job grid on one worker process per core (``$DALIGN_WORKERS``;
:mod:`dalign_core.workers`); the provenance's ``hardware`` records both
(``threads_per_process``, ``workers``). Ctrl-C stops the workers; the finished jobs are
kept and the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from dalign_core import distributed, workers
from dalign_core.atomic import atomic_write_text
from dalign_core.config import PROFILES, ExperimentConfig, default_results_dir, parse_overrides
from dalign_core.results import results_current, write_table

__all__ = ["run_experiment", "main", "results_dir_for"]

log = logging.getLogger("dalign")

Compute = Callable[[Any, Path], "tuple[Mapping[str, pd.DataFrame], dict[str, Any]]"]


def run_experiment(name: str, tables: tuple[str, ...], config: ExperimentConfig, compute: Compute,
                   out_dir: str | Path | None = None, force: bool = False, sharded: bool = False) -> Path:
    """Compute and write ``tables`` for ``config`` unless they are current; return the results folder.

    ``compute(config, out_dir)`` returns ``(tables by name, provenance extras)``; every
    name in ``tables`` must be present (an empty DataFrame is fine: it is written as
    such). ``out_dir`` is where the tables will go; a long computation may keep its
    finished parts there (see :func:`dalign_core.sweep.jobs_dir`). ``sharded``: ``compute``
    spreads its work over torchrun's ranks and returns the tables on rank 0 only (see the
    module docstring).
    """
    out_dir = results_dir_for(config, out_dir)
    ctx = distributed.context()
    if ctx.distributed and not sharded and not ctx.is_main:
        log.info("%s: runs on rank 0 alone; rank %d has nothing to do", name, ctx.rank)
        return out_dir
    shared = ctx.distributed and sharded
    workers.configure(getattr(config, "device", "auto"))  # on the CPU: one thread, before any model is built
    workers.reset()
    if shared:
        distributed.init(getattr(config, "device", "auto"))
    current = not force and results_current(out_dir, tables, config)
    if shared:
        current = distributed.broadcast(current)  # every rank takes rank 0's answer: they skip or work together
    if current:
        log.info("%s: results for this configuration (hash %s) exist; reusing them (force=True recomputes)",
                 name, config.config_hash())
        return out_dir
    changed = config.overrides()
    if changed and ctx.is_main:
        _record_overrides(out_dir, config, changed)
    started = time.perf_counter()
    frames, extra = compute(config, out_dir)
    ranks = distributed.hardware() if shared else None  # collective: every rank answers
    if not ctx.is_main:
        return out_dir
    extra = {**extra, "world_size": ctx.world_size if shared else 1, **({"ranks": ranks} if ranks else {})}
    missing = sorted(set(tables) - set(frames))
    if missing:
        raise RuntimeError(f"{name}: compute returned no table(s) {missing}")
    wall = time.perf_counter() - started
    for table in tables:
        write_table(frames[table], out_dir, table, config, wall, **extra)
    log.info("%s: wrote %s in %.0f s", name, ", ".join(tables), wall)
    return out_dir


def results_dir_for(config: ExperimentConfig, out_dir: str | Path | None = None) -> Path:
    """Where ``config``'s results go: ``out_dir`` if given, else :func:`default_results_dir` of the config.

    A config changed from its profile never writes into the profile's own folder: asked for
    ``results/<profile>`` (as an experiment's ``run`` may pass it), it gets
    ``results/<profile>+<hash of the changes>`` instead.
    """
    own = default_results_dir(config)
    if out_dir is None:
        return own
    out_dir = Path(out_dir)
    profile_dir = default_results_dir(config.profile)
    if own != profile_dir and out_dir.resolve() == profile_dir.resolve():
        log.info("%s differs from the %s profile in %s: its results go to %s, not over the profile's",
                 type(config).__module__.rsplit(".", 1)[-1], config.profile,
                 ", ".join(sorted(config.overrides())), own)
        return own
    return out_dir


def _record_overrides(out_dir: Path, config: ExperimentConfig, changed: dict[str, Any]) -> None:
    """``<out_dir>/overrides.json``: the profile and the changed fields of each experiment that wrote here."""
    path = out_dir / "overrides.json"
    try:
        record = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        record = {}
    record.setdefault("profile", config.profile)
    record.setdefault("experiments", {})[type(config).__module__.rsplit(".", 1)[-1]] = changed
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


def _results_folder(text: str) -> Path:
    """``--out``: a results folder; an empty name (which would mean the current folder) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a results folder (default: results/<profile>)")
    return Path(text)


def main(config_cls: type[ExperimentConfig], run: Callable, description: str | None = None,
         dry_run: Callable | None = None, argv: list[str] | None = None) -> None:
    """The ``python -m dalign_core.experiments.<name>`` command line.

    ``--profile --seed --set --out --force``, and ``--dry-run`` where the experiment has one
    (build the data and every model, time a few steps, print the projected wall time).
    ``--set field=value`` (repeatable) changes any field of the profile's config, parsed by the field's type
    (:func:`dalign_core.config.parse_overrides`); the results of a changed config go to
    ``results/<profile>+<hash>/`` unless ``--out`` names a folder.
    Under ``torchrun`` every rank runs this; ``--ranks-per-job`` sets
    ``$DALIGN_RANKS_PER_JOB`` (see :func:`dalign_core.distributed.ranks_per_job`).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--profile", choices=PROFILES, default="cpu", help="scale of the run (default: cpu)")
    parser.add_argument("--seed", type=int, default=None, help="override the profile's seed")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                        help="change a field of the profile's config, e.g. --set steps=300 --set widths=32,64 "
                             "(repeatable; values parsed by the field's type: ints, floats, tuples, strings, none); "
                             "results then go to results/<profile>+<hash>/")
    parser.add_argument("--out", type=_results_folder, default=None,
                        help="results folder (default: results/<profile>, or results/<profile>+<hash> with --set)")
    parser.add_argument("--force", action="store_true", help="rerun even if results for this config exist")
    if dry_run is not None:
        parser.add_argument("--dry-run", action="store_true",
                            help="build data and models, time a few steps, print the projected wall time; write nothing")
    parser.add_argument("--ranks-per-job", default=None, metavar="SPEC",
                        help="under torchrun: ranks that train one model together, '2' or width:ranks pairs "
                             "'2560:2,3072:4' (default: $DALIGN_RANKS_PER_JOB, else 1)")
    args = parser.parse_args(argv)
    ctx = distributed.context()
    prefix = f"[rank {ctx.rank}/{ctx.world_size}] " if ctx.distributed else ""
    logging.basicConfig(level=logging.INFO, format=f"{prefix}%(message)s")
    if args.ranks_per_job is not None:
        os.environ[distributed.RANKS_PER_JOB_VARIABLE] = args.ranks_per_job
    try:
        overrides = parse_overrides(config_cls, args.overrides)
        if args.seed is not None:
            overrides["seed"] = args.seed
        config = config_cls.for_profile(args.profile, **overrides)
    except (TypeError, ValueError) as error:  # an unknown field, a value of the wrong type, a rejected config
        parser.error(str(error))
    workers.configure(getattr(config, "device", "auto"))  # on the CPU: one thread, before any torch work
    if dry_run is not None and args.dry_run:
        if ctx.is_main:
            print(dry_run(config))
        return
    out_dir = args.out if args.out is not None else default_results_dir(config)
    try:
        with distributed.session(getattr(config, "device", "auto")):
            run(config, out_dir=out_dir, force=args.force)
    except KeyboardInterrupt as err:
        print(f"\n{prefix}{err if workers.INTERRUPTED in str(err) else workers.INTERRUPTED}", file=sys.stderr)
        sys.exit(130)
