"""The claims table: every claim of the paper with our computed verdict, from one profile's results files.

It trains nothing: it reads the tables the other experiments wrote into the same
folder (:func:`dalign_core.claims.claims_table`) and is recomputed on every run, so it
can never lag behind them. The provenance records which input tables it read, each
with its config hash and commit.

Run without Jupyter: ``python -m dalign_core.experiments.claims --profile cpu``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dalign_core.claims import claims_table
from dalign_core.config import PROFILES, ExperimentConfig
from dalign_core.experiments._runner import main, run_experiment

__all__ = ["Config", "TABLES", "run"]

TABLES = ("claims",)


@dataclass(frozen=True)
class Config(ExperimentConfig):
    """The claims table has no settings of its own beyond the profile whose results it reads."""

    profile: str = "cpu"
    seed: int = 0

    PROFILES = {profile: {} for profile in PROFILES}


def _inputs(out_dir: Path) -> dict[str, dict]:
    """The provenance of every table the claims read: its config hash and commit."""
    inputs = {}
    for path in sorted(out_dir.glob("*.json")):
        if path.stem == "claims":
            continue
        record = json.loads(path.read_text())
        inputs[path.stem] = {"config_hash": record.get("config_hash"),
                             "commit": (record.get("git") or {}).get("commit")}
    return inputs


def compute(config: Config, out_dir: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    return {"claims": claims_table(out_dir)}, {"inputs": _inputs(Path(out_dir))}


def run(config: Config, out_dir: str | Path | None = None, force: bool = True) -> Path:
    """Judge every claim from the tables in ``out_dir`` (default ``results/<profile>``); always recomputed."""
    return run_experiment("claims", TABLES, config, compute, out_dir=out_dir, force=True)


if __name__ == "__main__":
    main(Config, run, description=__doc__.splitlines()[0])
