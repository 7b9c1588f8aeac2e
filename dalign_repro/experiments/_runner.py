"""One convention for every experiment: a declared :class:`Experiment`, one runner, and the ``python -m`` entry.

An experiment module defines a ``Config`` (an :class:`~dalign_repro.config.ExperimentConfig`
with profiles), the names of its tables, and a ``compute(config, out_dir)`` that returns them,
and declares itself once::

    EXPERIMENT = register(Experiment("theory", Config, TABLES, compute, description=__doc__))
    run = EXPERIMENT.run

    if __name__ == "__main__":
        EXPERIMENT.main()

``python -m dalign_repro theory`` finds it in :data:`EXPERIMENTS` (:func:`experiment`), the same
command line as ``python -m dalign_repro.experiments.theory``; ``run(config, out_dir=None,
force=False)`` is what a notebook calls.

:func:`run_experiment` skips the work when every table exists with a provenance of
the same config hash (``force=True`` recomputes), times ``compute``, and writes each
table with its provenance JSON (written last, so its presence means the CSV is
complete). Messages go to the ``dalign`` logger: the command line shows them, a
notebook stays quiet.

A config changed from its profile's (``--set field=value`` on the command line,
``Config.for_profile(profile, **overrides)`` in a notebook) writes to a folder of its own,
``results/<profile>+<hash of the changes>/`` (:func:`dalign_repro.config.default_results_dir`),
never into the profile's: asked for ``results/<profile>`` with a changed config,
:func:`run_experiment` goes to that folder instead and says so, and records the changes in
its ``overrides.json``. An explicit other folder (``--out``) is used as given.

Under ``torchrun`` (:mod:`dalign_repro.training.distributed`) an experiment whose ``compute``
shares its jobs over the ranks (``sharded=True``: the width sweeps, the intervention and growth
studies) runs on every rank and rank 0 writes the tables, with the world size and every rank's
hardware in the provenance; any other experiment runs on rank 0 alone. Without torchrun it is a world of
one.

On the CPU every process computes on one thread (``$DALIGN_THREADS`` to change it), and
a world of one runs its job grid on one worker process per core (``$DALIGN_WORKERS``;
:mod:`dalign_repro.training.workers`); the provenance's ``hardware`` records both
(``threads_per_process``, ``workers``). Ctrl-C stops the workers; the finished jobs are
kept and the same command resumes.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
import importlib
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pandas as pd

from dalign_core.environment import env_flag
from dalign_core.atomic import atomic_write_text, require_writable
from dalign_repro.config import PROFILES, ExperimentConfig, default_results_dir, parse_overrides
from dalign_repro.report.results import results_current, write_tables
from dalign_core import device as processes
from dalign_repro.training import distributed, workers

__all__ = ["Experiment", "EXPERIMENTS", "register", "experiment", "experiment_names", "run_experiment", "main",
           "results_dir_for", "experiment_name", "check_results_folder", "config_yaml",
           "CHECKPOINTS_VARIABLE"]

CHECKPOINTS_VARIABLE = "DALIGN_CHECKPOINTS"
"""Where trained models' checkpoints go (:func:`dalign_repro.sweep.trained.checkpoint_root`); ``--checkpoints``
sets it."""

log = logging.getLogger("dalign")

Compute = Callable[[Any, Path], "tuple[Mapping[str, pd.DataFrame], dict[str, Any]]"]


def run_experiment(name: str, tables: tuple[str, ...], config: ExperimentConfig, compute: Compute,
                   out_dir: str | Path | None = None, force: bool = False, sharded: bool = False) -> Path:
    """Compute and write ``tables`` for ``config`` unless they are current; return the results folder.

    ``compute(config, out_dir)`` returns ``(tables by name, provenance extras)``; every
    name in ``tables`` must be present (an empty DataFrame is fine: it is written as
    such). ``out_dir`` is where the tables will go; a long computation may keep its
    finished parts there (see :func:`dalign_repro.sweep.plan.jobs_dir`). ``sharded``: ``compute``
    spreads its work over torchrun's ranks and returns the tables on rank 0 only (see the
    module docstring).
    """
    outer = workers.recorded()  # a sweep run inside a study: its workers and reused jobs are not the study's
    try:
        return _run_experiment(name, tables, config, compute, out_dir, force, sharded)
    finally:
        workers.restore(outer)


def _run_experiment(name: str, tables: tuple[str, ...], config: ExperimentConfig, compute: Compute,
                    out_dir: str | Path | None, force: bool, sharded: bool) -> Path:
    out_dir = results_dir_for(config, out_dir)
    ctx = distributed.context()
    if ctx.distributed and not sharded and not ctx.is_main:
        log.info("%s: runs on rank 0 alone; rank %d has nothing to do", name, ctx.rank)
        return out_dir
    shared = ctx.distributed and sharded
    processes.configure(getattr(config, "device", "auto"))  # on the CPU: one thread, before any model is built
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
        _record_overrides(out_dir, config, changed, name)
    started = time.perf_counter()
    frames, extra = compute(config, out_dir)
    ranks = distributed.hardware() if shared else None  # collective: every rank answers
    if not ctx.is_main:
        if shared:
            distributed.barrier()  # return once rank 0 has written the tables: the caller may read them next
        return out_dir
    resumed = workers.reused()  # an interrupted run's finished jobs: the wall time below covers only the rest
    extra = {**extra, "world_size": ctx.world_size if shared else 1, **({"ranks": ranks} if ranks else {}),
             **({"resumed": resumed} if resumed else {})}
    missing = sorted(set(tables) - set(frames))
    if missing:
        raise RuntimeError(f"{name}: compute returned no table(s) {missing}")
    wall = time.perf_counter() - started
    write_tables({table: frames[table] for table in tables}, out_dir, config, wall, **extra)  # all or nothing
    if shared:
        distributed.barrier()  # the other ranks wait here for the tables (a study reads its sweep's next)
    log.info("%s: wrote %s in %.0f s", name, ", ".join(tables), wall)
    return out_dir


@dataclass(frozen=True)
class Experiment:
    """One experiment as the runner sees it: its name, config class, tables and how they are computed.

    ``compute(config, out_dir)`` returns ``(tables by name, provenance extras)`` (:func:`run_experiment`).
    ``sharded``: ``compute`` shares its jobs over torchrun's ranks. ``dry_run(config, also_seeds)``: the text of a
    dry run (``--dry-run``; ``also_seeds``: the numbers of ``--also-seeds``), where the experiment has one.
    ``run``: the experiment's own ``run(config, out_dir, force)`` where it does more than compute its tables once
    (run other experiments first, recompute when its inputs changed, clean up after); by default :meth:`run`
    computes the tables unless they are current.
    """

    name: str
    config: type[ExperimentConfig]
    tables: tuple[str, ...]
    compute: Compute | None = None
    sharded: bool = False
    dry_run: Callable[..., str] | None = None
    description: str | None = None
    """The command line's description (the first line is kept: a module's docstring may be given whole)."""
    runner: Callable[..., Path] | None = None

    def __post_init__(self):
        if (self.compute is None) == (self.runner is None):
            raise TypeError(f"experiment {self.name!r}: give compute (the tables) or runner (its own run), one of them")

    def run(self, config: ExperimentConfig, out_dir: str | Path | None = None, force: bool = False) -> Path:
        """Write the experiment's tables for ``config`` into ``out_dir`` (default ``results/<profile>``, or its
        ``+<hash>`` folder for a changed config), skipped when current unless ``force``; returns the folder."""
        if self.runner is not None:
            return self.runner(config, out_dir=out_dir, force=force)
        return run_experiment(self.name, self.tables, config, self.compute, out_dir=out_dir, force=force,
                              sharded=self.sharded)

    def main(self, argv: list[str] | None = None) -> None:
        """The experiment's command line (:func:`main`)."""
        description = self.description.strip().splitlines()[0] if self.description else None
        main(self.config, self.run, description=description, dry_run=self.dry_run, argv=argv)


_REGISTERED: dict[str, Experiment] = {}

EXPERIMENTS: Mapping[str, Experiment] = types.MappingProxyType(_REGISTERED)
"""Experiment name → its declaration, for the modules imported so far (:func:`experiment` imports one by name)."""


def register(declared: Experiment) -> Experiment:
    """Add ``declared`` to :data:`EXPERIMENTS` under its name (a module run as ``__main__`` and imported again
    declares the same name twice: the later one is kept); returns it."""
    _REGISTERED[declared.name] = declared
    return declared


def experiment_names() -> tuple[str, ...]:
    """The experiments of :mod:`dalign_repro.experiments` (:data:`dalign_repro.experiments.NAMES`)."""
    from dalign_repro.experiments import NAMES

    return NAMES


def experiment(name: str) -> Experiment:
    """The declared experiment ``name``, its module imported (``dalign_repro.experiments.<name>``). Raises
    ValueError listing the experiments for any other name."""
    if name not in experiment_names():
        raise ValueError(f"no experiment named {name!r}; choose one of: {', '.join(experiment_names())}")
    importlib.import_module(f"dalign_repro.experiments.{name}")
    if name not in _REGISTERED:
        raise RuntimeError(f"dalign_repro.experiments.{name} declares no Experiment named {name!r} (register it)")
    return _REGISTERED[name]


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
                 experiment_name(config), config.profile,
                 ", ".join(sorted(config.overrides())), own)
        return own
    return out_dir


def experiment_name(config: ExperimentConfig) -> str:
    """The experiment a config belongs to: its module's last name (``llama_width``), also when that module runs
    as ``python -m dalign_repro.experiments.llama_width`` (where its ``__name__`` is ``"__main__"``)."""
    module = type(config).__module__
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name if spec is not None and spec.name else Path(sys.argv[0]).stem
    return module.rsplit(".", 1)[-1]


def _record_overrides(out_dir: Path, config: ExperimentConfig, changed: dict[str, Any], name: str) -> None:
    """``<out_dir>/overrides.json``: the profile and the changed fields of each experiment that wrote here, keyed by
    the experiment's ``name`` (what it passes to :func:`run_experiment`)."""
    path = out_dir / "overrides.json"
    try:
        record = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        record = {}
    record.setdefault("profile", config.profile)
    record.setdefault("experiments", {})[name] = changed
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


def _results_folder(text: str) -> Path:
    """``--out``: a results folder; an empty name (which would mean the current folder) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a results folder (default: results/<profile>)")
    return Path(text)


def check_results_folder(folder: Path, flag: str = "--out") -> None:
    """Refuse a results folder that cannot hold results, before any work: an existing file (or a path under one),
    or a folder where no file can be created (read-only, no permission). A full disk shows only when the tables
    are written; the old tables are then kept (:func:`dalign_repro.report.results.write_tables`)."""
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{flag} {str(folder)!r} is a file, not a folder; give a results folder (it is created if "
                         "missing)")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {str(folder)!r} cannot be created: {str(existing)!r} is a file, not a folder")
    require_writable(flag, folder, existing)


def _is_default_folder(out: Path, config: ExperimentConfig) -> bool:
    """Whether ``--out`` names the results folder the experiment uses anyway (``results/<profile>`` or its
    ``+<hash>`` folder): its checkpoints then stay where the experiments of that folder keep them."""
    try:
        given = out.expanduser().resolve()
        return given in (default_results_dir(config).resolve(), default_results_dir(config.profile).resolve())
    except OSError:
        return False


def _yaml_config(path: Path) -> dict[str, Any]:
    """``--config FILE.yaml``: a mapping of config fields (``profile`` and ``seed`` included), lists as tuples."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"--config {str(path)!r} cannot be read ({err.strerror or err})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"--config {str(path)!r} is not valid YAML ({detail})") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise ValueError(f"--config {str(path)!r} must be a YAML mapping of config fields (e.g. 'steps: 300'), as "
                         "--print-config writes it")

    def plain(value):
        return tuple(plain(item) for item in value) if isinstance(value, list) else value

    return {key: plain(value) for key, value in data.items()}


def config_yaml(config: ExperimentConfig) -> str:
    """The config as YAML that ``--config`` reads back (``--print-config``), with its hash as a comment."""
    import yaml

    header = (f"# {experiment_name(config)} at profile {config.profile} (config hash {config.config_hash()}); "
              f"changed from the profile: {', '.join(sorted(config.overrides())) or 'nothing'}\n")
    return header + yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None)


def _one_line(error: BaseException) -> str:
    """An error's message on one line; an OSError as ``<what went wrong>: <file>``."""
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    if isinstance(error, workers.WorkerError):  # each job's traceback was logged as it failed: name the jobs here
        return str(error).strip().splitlines()[0]
    return re.sub(r"\s*\n\s*", " ", str(error).strip()) or type(error).__name__


def main(config_cls: type[ExperimentConfig], run: Callable, description: str | None = None,
         dry_run: Callable | None = None, argv: list[str] | None = None) -> None:
    """The ``python -m dalign_repro.experiments.<name>`` command line (:meth:`Experiment.main` calls it).

    ``--profile --seed --set --config --print-config --out --checkpoints --force``, and ``--dry-run`` where the
    experiment has one (build the data and every model, time a few steps, print the projected wall time).
    ``--set field=value`` (repeatable) changes any field of the profile's config, the value read as a TOML value and
    checked against the field's type (:func:`dalign_repro.config.parse_overrides`); ``--config FILE.yaml`` changes
    those the file names (``--set`` goes on top; ``--print-config`` writes such a file). The results of a changed config go to
    ``results/<profile>+<hash>/`` unless ``--out`` names a folder; with ``--out``, the trained models'
    checkpoints go to ``<out>/checkpoints`` (``--checkpoints`` or ``$DALIGN_CHECKPOINTS`` to choose), so nothing
    is written outside the folders named.
    Under ``torchrun`` every rank runs this; ``--ranks-per-job`` sets
    ``$DALIGN_RANKS_PER_JOB`` (see :func:`dalign_repro.training.distributed.ranks_per_job`).

    A refused input (a bad field, a folder that cannot be written, a full disk, a profile this machine cannot
    run) ends with one line on stderr and exit status 1 (2 for usage errors); ``DALIGN_DEBUG=1`` shows the
    traceback instead.
    """
    parser = _parser(description, dry_run is not None)
    args = parser.parse_args(argv)
    ctx = distributed.context()
    prefix = f"[rank {ctx.rank}/{ctx.world_size}] " if ctx.distributed else ""
    logging.basicConfig(level=logging.INFO, format=f"{prefix}%(message)s")
    if args.ranks_per_job is not None:
        os.environ[distributed.RANKS_PER_JOB_VARIABLE] = args.ranks_per_job
    dry = dry_run is not None and args.dry_run
    also_seeds = getattr(args, "also_seeds", [])  # an option of experiments that have a dry run
    if also_seeds and not dry:
        parser.error("--also-seeds projects a dry run at other numbers of seeds: add --dry-run")
    if any(n < 1 for n in also_seeds):
        parser.error(f"--also-seeds takes numbers of seeds, each at least 1, got {also_seeds}")
    try:
        config = _config_of(config_cls, args)
        if ctx.distributed:  # one line here, not one traceback per rank later
            _check_ranks(config, args.ranks_per_job, ctx.world_size)
        _check_folders(args, writes=not (args.print_config or dry))
    except (TypeError, ValueError) as error:  # an unknown field, a value of the wrong type, a rejected config
        if ctx.is_main:
            parser.error(_one_line(error))
        sys.exit(2)
    if args.print_config:
        if ctx.is_main:
            print(config_yaml(config), end="")
        return
    _set_checkpoints(args, config)
    _execute(config, run, dry_run if dry else None, args, ctx.is_main, prefix)


def _parser(description: str | None, has_dry_run: bool) -> argparse.ArgumentParser:
    """The experiment command line's options (see :func:`main`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--profile", choices=PROFILES, default=None, help="scale of the run (default: cpu)")
    parser.add_argument("--seed", type=int, default=None, help="override the profile's seed")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                        help="change a field of the profile's config, e.g. --set steps=300 --set 'widths=[32, 64]' "
                             "(repeatable; each value a TOML value checked against the field's type: 300, 1e-3, "
                             "true, \"cifar10\", [32, 64], [[4, 4], [16, 16]]; a bare word is a string where the "
                             "field holds one, none is None where it allows it); results then go to "
                             "results/<profile>+<hash>/")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE.yaml",
                        help="change the fields this YAML mapping names (as --print-config writes it; --set and "
                             "--seed go on top, --profile before it)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config as YAML (for --config) and exit; runs nothing")
    parser.add_argument("--out", type=_results_folder, default=None,
                        help="results folder (default: results/<profile>, or results/<profile>+<hash> with --set)")
    parser.add_argument("--checkpoints", type=_results_folder, default=None, metavar="FOLDER",
                        help="where trained models' checkpoints go (default: $DALIGN_CHECKPOINTS, else "
                             "<out>/checkpoints with --out, else checkpoints/ of the repository)")
    parser.add_argument("--force", action="store_true", help="rerun even if results for this config exist")
    if has_dry_run:
        parser.add_argument("--dry-run", action="store_true",
                            help="build data and models, time a few steps, print the projected wall time; write nothing")
        parser.add_argument("--also-seeds", type=int, nargs="+", default=[], metavar="N",
                            help="with --dry-run: also project the sweep at N seeds from the same timings (e.g. "
                                 "--also-seeds 3 5)")
    parser.add_argument("--ranks-per-job", default=None, metavar="SPEC",
                        help="under torchrun: ranks that train one model together, '2' or width:ranks pairs "
                             "'2560:2,3072:4' (default: $DALIGN_RANKS_PER_JOB, else 1)")
    return parser


def _config_of(config_cls: type[ExperimentConfig], args: argparse.Namespace) -> ExperimentConfig:
    """The config the options ask for: the profile (``--profile``, else the ``--config`` file's, else cpu), the
    file's fields, then ``--set``, then ``--seed``. Raises TypeError or ValueError naming what is wrong."""
    overrides = _yaml_config(args.config) if args.config is not None else {}
    profile = args.profile or overrides.pop("profile", None) or "cpu"
    overrides.pop("profile", None)
    overrides = parse_overrides(config_cls, overrides)
    overrides.update(parse_overrides(config_cls, args.overrides))
    if args.seed is not None:
        overrides["seed"] = args.seed
    return config_cls.for_profile(profile, **overrides)


def _check_ranks(config: ExperimentConfig, given: str | None, world_size: int) -> None:
    """Under torchrun: the ranks per job (``--ranks-per-job``, ``given``, or the variable) fit the widths and divide
    the batch; raises ValueError naming the option the user gave."""
    try:
        groups = distributed.ranks_per_job(getattr(config, "widths", ()) or (), world_size)
    except ValueError as error:  # name the option the user gave, not the variable it sets
        text = str(error)
        if given is not None:
            text = text.replace(f"{distributed.RANKS_PER_JOB_VARIABLE}=", "--ranks-per-job ", 1)
        raise ValueError(text) from None
    batch = getattr(config, "batch_size", None)
    odd = sorted({g for g in groups.values() if batch and batch % g})
    if odd:
        raise ValueError(f"--ranks-per-job: {odd} rank(s) per job do not divide batch_size {batch}; choose a "
                         "number of ranks per job that divides it")


def _check_folders(args: argparse.Namespace, writes: bool) -> None:
    """``--out`` (where the run ``writes``) and ``--checkpoints`` can hold results, before any work."""
    if args.out is not None and writes:
        check_results_folder(args.out)
    if args.checkpoints is not None:
        check_results_folder(args.checkpoints, "--checkpoints")


def _set_checkpoints(args: argparse.Namespace, config: ExperimentConfig) -> None:
    """Point :data:`CHECKPOINTS_VARIABLE` at ``--checkpoints``, or at ``<out>/checkpoints`` where ``--out`` names a
    folder of its own and the variable is unset (so nothing is written outside the folders named)."""
    if args.checkpoints is not None:
        os.environ[CHECKPOINTS_VARIABLE] = str(args.checkpoints.expanduser().resolve())
    elif args.out is not None and not os.environ.get(CHECKPOINTS_VARIABLE) and not _is_default_folder(args.out, config):
        os.environ[CHECKPOINTS_VARIABLE] = str((args.out.expanduser() / "checkpoints").resolve())


def _execute(config: ExperimentConfig, run: Callable, dry_run: Callable | None, args: argparse.Namespace,
             is_main: bool, prefix: str) -> None:
    """Print ``dry_run(config, also_seeds)``, or ``run`` the experiment into ``--out``; a refused run ends with one line on stderr
    and exit status 1 (130 on Ctrl-C)."""
    name = experiment_name(config)
    try:
        processes.configure(getattr(config, "device", "auto"))  # on the CPU: one thread, before any torch work
        if dry_run is not None:
            if is_main:
                print(dry_run(config, also_seeds=args.also_seeds))
            return
        out_dir = args.out if args.out is not None else default_results_dir(config)
        with distributed.session(getattr(config, "device", "auto")):
            run(config, out_dir=out_dir, force=args.force)
    except KeyboardInterrupt as err:
        print(f"\n{prefix}{err if workers.INTERRUPTED in str(err) else workers.INTERRUPTED}", file=sys.stderr)
        sys.exit(130)
    except (ValueError, OSError, RuntimeError, ImportError) as error:
        if env_flag("DALIGN_DEBUG"):
            raise
        kept = (" (the results already there are kept)" if isinstance(error, OSError) and
                error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES) else "")
        print(f"{prefix}{name}: error: {_one_line(error)}{kept}", file=sys.stderr)
        sys.exit(1)
