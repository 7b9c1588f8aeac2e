"""The claims table: every claim of the paper with our computed verdict, from one profile's results files.

It trains nothing: it reads the tables the other experiments wrote into the same
folder (:func:`dalign_repro.claims.table.claims_table`). The provenance records which input
tables it read (config hash, digest of the CSV) and a digest of the code that judges; the
table is recomputed whenever any of them changed, so it never lags behind them.

Run without Jupyter: ``python -m dalign_repro.experiments.claims --profile cpu``.

The book reads the table through :func:`current`, which never rewrites a committed file: where the committed
table is stale (the judging code or an input table changed since it was written), it judges the tables in memory
(kept in the data cache, so the landing page and the claims chapter judge once) and says so; ``python -m
dalign_repro.experiments.claims --profile cpu`` then rewrites the committed table.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import dalign_repro
from dalign_repro.claims.table import claims_table
from dalign_repro.config import ExperimentConfig, default_results_dir
from dalign_repro.experiments._runner import Experiment, register, run_experiment

__all__ = ["Config", "TABLES", "committed", "current", "run"]

TABLES = ("claims",)


@dataclass(frozen=True)
class Config(ExperimentConfig):
    """The claims table has no settings of its own beyond the profile whose results it reads."""

    profile: str = "cpu"
    seed: int = 0


JUDGES = ("claims", "studies", "report", "sweep")
"""The folders of dalign_repro whose code decides a verdict (the claims, the studies' readings, the chapters'
sentences, the trend tests): a change to any of their modules makes the table stale too."""

DRAWS_ONLY = ("report/plots.py", "report/figure_style.py", "report/timings.py")
"""Modules of :data:`JUDGES` that draw figures or read timings and decide no verdict: left out of the digest, so a
change to a figure's style does not make the committed table stale."""


def _inputs(out_dir: Path) -> dict[str, dict]:
    """The provenance of every table the claims read (config hash and commit), and the judging code's digest."""
    package = Path(dalign_repro.__file__).parent
    modules = sorted(path for folder in JUDGES for path in (package / folder).rglob("*.py")
                     if path.relative_to(package).as_posix() not in DRAWS_ONLY)
    code = hashlib.sha256(b"".join(path.read_bytes() for path in modules))
    inputs = {"code": {"sha256": code.hexdigest()[:16]}}
    for path in sorted(out_dir.glob("*.json")):
        if path.stem == "claims":
            continue
        record = json.loads(path.read_text())
        table = path.with_suffix(".csv")
        inputs[path.stem] = {"config_hash": record.get("config_hash"),
                             "sha256": hashlib.sha256(table.read_bytes()).hexdigest()[:16] if table.is_file() else None}
    return inputs


def compute(config: Config, out_dir: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    return {"claims": claims_table(out_dir)}, {"inputs": _inputs(Path(out_dir))}


def run(config: Config, out_dir: str | Path | None = None, force: bool = False) -> Path:
    """Judge every claim from the tables in ``out_dir`` (default ``results/<profile>``).

    The table is rewritten whenever an input table or the judging code changed since it
    was written (so it never lags behind them), else reused as it is.
    """
    out_dir = Path(out_dir) if out_dir is not None else default_results_dir(config.profile)
    record = out_dir / "claims.json"
    stale = not record.is_file() or json.loads(record.read_text()).get("inputs") != _inputs(out_dir)
    return run_experiment("claims", TABLES, config, compute, out_dir=out_dir, force=force or stale)


def committed(folder: Path) -> bool:
    """True when git tracks a file in ``folder`` (a committed results folder, whose files the book must leave as they
    were, and to which it adds none); False outside a git work tree or for a folder git does not track."""
    folder = Path(folder)
    if not folder.is_dir():
        return False
    try:
        listed = subprocess.run(["git", "ls-files", "--", "."], cwd=folder, check=True, capture_output=True,
                                text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(listed.stdout.strip())


def current(config: Config, out_dir: str | Path | None = None, force: bool = False
            ) -> tuple[pd.DataFrame, dict, bool]:
    """The claims table the current code judges from ``out_dir``'s tables, without rewriting a committed file.

    Returns ``(table, provenance, stored)``. ``stored`` is True when the table is the one in ``out_dir`` (up to date,
    or just written there by :func:`run` because git tracks nothing in that folder: ``results/smoke``,
    ``results/lab``). In a committed folder (``results/cpu``, ``results/gpu``) whose table is stale or missing, the
    table is judged in memory, kept in the data cache under the digest of its inputs
    (``$DALIGN_CACHE/claims/<digest>.csv``: a second reader judges nothing), ``stored`` is False and
    ``provenance["inputs"]`` lists what it was judged from. ``force`` writes the folder's table anyway
    (``make notebooks FORCE=1``).
    """
    from dalign_core.atomic import atomic_path
    from dalign_repro.data.manifest import default_cache_dir
    from dalign_repro.report.results import read_table

    out_dir = Path(out_dir) if out_dir is not None else default_results_dir(config.profile)
    record, csv = out_dir / "claims.json", out_dir / "claims.csv"
    inputs = _inputs(out_dir)
    stored = json.loads(record.read_text()) if record.is_file() else {}
    if not force and stored.get("inputs") == inputs and csv.is_file():
        return (*read_table(out_dir, "claims"), True)
    if force or not committed(out_dir):
        run(config, out_dir, force=force)
        return (*read_table(out_dir, "claims"), True)
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    cached = default_cache_dir() / "claims" / f"{digest}.csv"
    try:
        table = pd.read_csv(cached)
    except (OSError, ValueError, pd.errors.EmptyDataError):
        table = claims_table(out_dir)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(cached) as tmp:
                table.to_csv(tmp, index=False)
            table = pd.read_csv(cached)  # the same types as a table read back from its file
        except OSError:
            pass  # a read-only cache: judged again next time
    return table, {**stored, "inputs": inputs, "judged_in_memory": True}, False


EXPERIMENT = register(Experiment("claims", Config, TABLES, runner=run, description=__doc__))

if __name__ == "__main__":
    EXPERIMENT.main()
