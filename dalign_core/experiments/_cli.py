"""The shared ``python -m dalign_core.experiments.<name>`` command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from dalign_core.results import PROFILES, default_results_dir


def run_cli(config_cls, run: Callable, description: str, argv: list[str] | None = None) -> None:
    """Parse ``--profile --seed --out --force`` and call ``run(config, out_dir=..., force=...)``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--profile", choices=PROFILES, default="cpu", help="scale of the run (default: cpu)")
    parser.add_argument("--seed", type=int, default=None, help="override the profile's seed")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: results/<profile>)")
    parser.add_argument("--force", action="store_true", help="rerun even if results for this config exist")
    args = parser.parse_args(argv)
    overrides = {} if args.seed is None else {"seed": args.seed}
    config = config_cls.for_profile(args.profile, **overrides)
    out_dir = args.out if args.out is not None else default_results_dir(args.profile)
    run(config, out_dir=out_dir, force=args.force)
