"""The experiments behind the book's chapters: one module each, a config dataclass with its profiles, and one
declared :class:`~dalign_repro.experiments._runner.Experiment` that the shared runner serves (its ``run`` for the
notebooks, ``python -m dalign_repro <name>`` and ``python -m dalign_repro.experiments.<name>`` for the command line).
The model families they train are specs of :mod:`dalign_repro.families`, looked up by name.

May import anything below it: families, sweep, studies, report, claims and the rest.
"""

NAMES = ("theory", "llama_width", "pythia_width", "pythia_checkpoints", "resnet_width", "interventions", "claims",
         "llama_depth", "growth", "llama_context")
"""Every experiment module's name, in the order of the book's chapters: each declares the experiment of that name
(``tests/test_experiments_runner.py`` checks both ways)."""

__all__ = ["NAMES", "EXPERIMENTS", "Experiment", "experiment", "experiment_names"]

_FROM_RUNNER = ("EXPERIMENTS", "Experiment", "experiment", "experiment_names")


def __getattr__(name: str):
    """The runner's names, imported on first use: ``python -m dalign_repro`` lists :data:`NAMES` without importing
    torch and pandas (the runner's imports), which an experiment's own import brings in anyway."""
    if name in _FROM_RUNNER:
        from dalign_repro.experiments import _runner

        return getattr(_runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
