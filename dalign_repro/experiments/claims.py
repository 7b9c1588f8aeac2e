"""The claims table: every claim of the paper with our computed verdict, from one profile's results files.

It trains nothing: it reads the tables the other experiments wrote into the same
folder (:func:`dalign_repro.claims.table.claims_table`). The provenance records which input
tables it read (config hash, digest of the CSV) and a digest of the code that judges; the
table is recomputed whenever any of them changed, so it never lags behind them.

Run without Jupyter: ``python -m dalign_repro.experiments.claims --profile cpu``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import dalign_repro
from dalign_repro.claims.table import claims_table
from dalign_repro.config import ExperimentConfig, default_results_dir
from dalign_repro.experiments._runner import main, run_experiment

__all__ = ["Config", "TABLES", "run"]

TABLES = ("claims",)


@dataclass(frozen=True)
class Config(ExperimentConfig):
    """The claims table has no settings of its own beyond the profile whose results it reads."""

    profile: str = "cpu"
    seed: int = 0


JUDGES = ("claims", "studies", "report", "sweep")
"""The folders of dalign_repro whose code decides a verdict (the claims, the studies' readings, the chapters'
sentences, the trend tests): a change to any of their modules makes the table stale too."""


def _inputs(out_dir: Path) -> dict[str, dict]:
    """The provenance of every table the claims read (config hash and commit), and the judging code's digest."""
    package = Path(dalign_repro.__file__).parent
    modules = sorted(path for folder in JUDGES for path in (package / folder).rglob("*.py"))
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


if __name__ == "__main__":
    main(Config, run, description=__doc__.splitlines()[0])
