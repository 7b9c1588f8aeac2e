"""``python -m dalign_repro <experiment> [--profile P] [--set field=value ...]``: run one experiment.

The same as ``python -m dalign_repro.experiments.<experiment>``; ``python -m dalign_repro`` alone lists them.
"""

from __future__ import annotations

import pkgutil
import runpy
import sys
from pathlib import Path

import dalign_repro.experiments as experiments


def experiment_names() -> list[str]:
    """The experiments that have a ``python -m`` entry (the public modules of :mod:`dalign_repro.experiments` with a
    ``__main__`` block)."""
    folder = Path(experiments.__path__[0])
    return sorted(m.name for m in pkgutil.iter_modules(experiments.__path__) if not m.name.startswith("_")
                  and 'if __name__ == "__main__":' in (folder / f"{m.name}.py").read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    names = experiment_names()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m dalign_repro <experiment> [--profile P] [--set field=value ...] [--dry-run]\n"
              "experiments: " + ", ".join(names))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"error: no experiment named {name!r}; choose one of: {', '.join(names)}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m dalign_repro {name}", *rest]
    runpy.run_module(f"dalign_repro.experiments.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
