"""``python -m dalign_repro <experiment> [--profile P] [--set field=value ...]``: run one experiment.

The same command line as ``python -m dalign_repro.experiments.<experiment>``: both are the declared
:class:`~dalign_repro.experiments._runner.Experiment`'s :meth:`~dalign_repro.experiments._runner.Experiment.main`.
``python -m dalign_repro`` alone lists the experiments.
"""

from __future__ import annotations

import sys

from dalign_repro.experiments import NAMES


def main(argv: list[str] | None = None) -> int:
    """Run the experiment ``argv[0]`` names with the rest of ``argv`` as its options; the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    names = sorted(NAMES)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m dalign_repro <experiment> [--profile P] [--set field=value ...] [--dry-run]\n"
              "experiments: " + ", ".join(names))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"error: no experiment named {name!r}; choose one of: {', '.join(names)}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m dalign_repro {name}", *rest]  # the usage line argparse prints names the command typed
    from dalign_repro.experiments import experiment  # imports torch: only once an experiment runs

    experiment(name).main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
