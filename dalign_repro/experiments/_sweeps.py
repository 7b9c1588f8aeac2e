"""The width sweeps' one declaration: a registered family's sweep at a config, as an experiment of the runner.

The five sweep experiments (``llama_width``, ``llama_depth``, ``pythia_width``, ``resnet_width``, ``llama_context``)
differ only in their config and the family spec they name; each declares itself with one call::

    EXPERIMENT = sweep_experiment("pythia_width", Config, "pythia", description=__doc__)

A config with a ``sweeps()`` method (Pythia's depth regimes, ResNet's data sets, the contexts) runs one sweep per
regime into one set of tables, told apart by the family's columns (:func:`dalign_repro.sweep.run.run_sweeps`);
any other config is one sweep (:func:`dalign_repro.sweep.run.run_sweep`), its finished jobs kept under the results
folder until the tables are written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dalign_repro.experiments._runner import Experiment, register
from dalign_repro.families import family
from dalign_repro.sweep.family import SweepConfig
from dalign_repro.sweep.plan import jobs_dir
from dalign_repro.sweep.projection import dry_run as sweep_dry_run
from dalign_repro.sweep.run import run_sweep, run_sweeps, tables_of

__all__ = ["sweep_experiment", "regimes"]


def regimes(config: SweepConfig) -> list[SweepConfig] | None:
    """The sibling sweeps of ``config`` (its ``sweeps()``), or None for a config that is one sweep."""
    sweeps = getattr(config, "sweeps", None)
    return sweeps() if callable(sweeps) else None


def sweep_experiment(name: str, config: type[SweepConfig], family_name: str, description: str | None = None
                     ) -> Experiment:
    """Declare and register experiment ``name``: family ``family_name``'s sweep (or sweeps) at a ``config``.

    Its tables are the family's (:func:`~dalign_repro.sweep.run.tables_of`); it shares its jobs over torchrun's
    ranks; ``--dry-run`` builds the data and every model, times a few steps and projects each sweep's wall time.
    """

    def compute(config: SweepConfig, out_dir: Path):
        spec, sweeps = family(family_name, config), regimes(config)
        if sweeps is None:
            return run_sweep(config, spec, jobs=jobs_dir(out_dir, config, spec))
        return run_sweeps(sweeps, spec, out_dir)

    def dry_run(config: SweepConfig, also_seeds: Sequence[int] = ()) -> str:
        return "\n".join(sweep_dry_run(c, family(family_name, c), also_seeds=also_seeds)
                         for c in regimes(config) or [config])

    return register(Experiment(name, config, tables_of(family(family_name)), compute, sharded=True, dry_run=dry_run,
                               description=description))
