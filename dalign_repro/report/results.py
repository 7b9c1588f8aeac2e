"""Results files: tidy CSV tables with a provenance JSON beside each, written atomically.

Every experiment writes ``results/<profile>/<name>.csv`` (one row per measurement)
and ``results/<profile>/<name>.json`` (config, config hash, seed, git commit,
hardware, wall time, package versions).  The book, the benchmarks and other tools
read these files; nothing reads an experiment's in-memory state.

Both files are written atomically (:mod:`dalign_core.atomic`), so a reader never
sees half a file and an interrupted run leaves the previous good file in place.
Profiles, the results folder of a profile and the config base class live in
:mod:`dalign_repro.config`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from dalign_repro.config import REPO_ROOT, ExperimentConfig

__all__ = ["provenance", "write_table", "write_tables", "read_table", "results_current"]

_PACKAGES = ("torch", "torchvision", "numpy", "pandas", "transformers", "tokenizers", "safetensors")


def _git_commit() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            # The results being rewritten are not a change of code: leave results/ out of the check.
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        return {"commit": commit, "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        # A copy of the tree without .git (e.g. shipped to a GPU machine): the sender may name the commit.
        return {"commit": os.environ.get("DALIGN_GIT_COMMIT") or None, "dirty": None}


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(config: ExperimentConfig, wall_time_s: float, **extra: Any) -> dict[str, Any]:
    """The provenance record written beside every results table.

    Holds the config and its hash, the seed, the git commit (and whether the tree
    was dirty), the hardware, the wall time in seconds, package versions and the
    UTC time of writing; ``extra`` adds experiment-specific fields.
    """
    from dalign_repro.training import workers  # noqa: PLC0415  (torch loads only when a provenance is written)

    return {
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "profile": getattr(config, "profile", None),
        "seed": getattr(config, "seed", None),
        "git": _git_commit(),
        "hardware": workers.hardware(),
        "wall_time_s": round(float(wall_time_s), 3),
        "versions": _versions(),
        "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }


def write_table(
    table: pd.DataFrame, out_dir: str | os.PathLike, name: str, config: ExperimentConfig, wall_time_s: float, **extra: Any
) -> Path:
    """Write ``<out_dir>/<name>.csv`` and its provenance ``<out_dir>/<name>.json``; return the CSV path.

    It records the CSV's row count (``rows``) and sha256 (``table_sha256``), which
    :func:`read_table` and :func:`results_current` check. Both files are written whole under
    temporary names before either replaces its old version (see :func:`write_tables`), so a
    full disk or an interrupted write leaves the previous results as they were.
    """
    return write_tables({name: table}, out_dir, config, wall_time_s, **extra)[name]


def write_tables(tables: "dict[str, pd.DataFrame]", out_dir: str | os.PathLike, config: ExperimentConfig,
                 wall_time_s: float, **extra: Any) -> dict[str, Path]:
    """Write each ``<out_dir>/<name>.csv`` with its provenance ``<name>.json``; return the CSV paths by name.

    Every file is first written completely under a temporary name in ``out_dir`` (and flushed
    to disk); only when all of them are complete are they renamed onto their final names,
    each CSV before its JSON. A write that fails (``ENOSPC``, a read-only folder, Ctrl-C)
    removes the temporaries and leaves every old file in place, so ``--force`` on a full disk
    never loses the results it was replacing. Between two renames a reader may see a new CSV
    beside its old JSON: the recorded sha256 then disagrees, and both :func:`read_table`
    and :func:`results_current` treat the pair as not current.
    """
    from dalign_core.atomic import replace_all

    out_dir = Path(out_dir)
    contents: list[tuple[Path, bytes]] = []
    for name, table in tables.items():
        csv_path = out_dir / f"{name}.csv"
        text = table.to_csv(index=False).encode("utf-8")
        record = provenance(config, wall_time_s, table=csv_path.name, rows=len(table), table_sha256=_sha256(text),
                            **extra)
        contents += [(csv_path, text), (out_dir / f"{name}.json",
                                        (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8"))]
    replace_all(contents)
    return {name: out_dir / f"{name}.csv" for name in tables}


class ResultsMismatchError(ValueError):
    """A results CSV differs from what its provenance JSON records (cut short, edited or replaced)."""


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _rerun_hint(profile: str) -> str:
    return (f"rerun the experiment that writes it with --force (`make notebooks PROFILE={profile} FORCE=1`, or "
            f"`python -m dalign_repro.experiments.<experiment> --profile {profile} --force`)")


def read_table(out_dir: str | os.PathLike, name: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Read ``<name>.csv`` and its provenance; a clear error says how to produce a missing one.

    The CSV is checked against its provenance: the sha256 it records (tables written
    before the digest was recorded: the row count alone). A mismatch raises
    :class:`ResultsMismatchError` naming the file and how to rewrite it, since a table
    cut short or edited would change the conclusions built on it without a word.
    """
    out_dir = Path(out_dir)
    csv_path, json_path = out_dir / f"{name}.csv", out_dir / f"{name}.json"
    if not csv_path.exists() or not json_path.exists():
        raise FileNotFoundError(
            f"{csv_path} (with its provenance {json_path.name}) does not exist; run the experiment that "
            f"writes it first, e.g. `make notebooks PROFILE={out_dir.name}`"
        )
    try:
        record = json.loads(json_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ResultsMismatchError(f"{json_path} (the provenance of {csv_path.name}) is not valid JSON ({error}); "
                                   f"{_rerun_hint(out_dir.name)}") from None
    if not isinstance(record, dict):
        raise ResultsMismatchError(f"{json_path} (the provenance of {csv_path.name}) is not a JSON object; "
                                   f"{_rerun_hint(out_dir.name)}")
    hint = _rerun_hint(str(record.get("profile") or out_dir.name))
    data = csv_path.read_bytes()
    expected_digest = record.get("table_sha256")
    if expected_digest is not None and _sha256(data) != expected_digest:
        raise ResultsMismatchError(
            f"{csv_path} does not match its provenance {json_path.name}: its sha256 is {_sha256(data)}, the "
            f"provenance records {expected_digest} (the file was cut short, edited or replaced after it was "
            f"written), so the results built on it cannot be trusted; {hint}"
        )
    try:
        table = pd.read_csv(csv_path)
    except pd.errors.EmptyDataError:  # an experiment with nothing to report (e.g. every run failed)
        table = pd.DataFrame()
    expected_rows = record.get("rows")
    if isinstance(expected_rows, int) and not isinstance(expected_rows, bool) and len(table) != expected_rows:
        raise ResultsMismatchError(
            f"{csv_path} does not match its provenance {json_path.name}: it has {len(table)} row(s), the "
            f"provenance records {expected_rows} (the file was cut short or edited after it was written), so the "
            f"results built on it cannot be trusted; {hint}"
        )
    return table, record


def results_current(out_dir: str | os.PathLike, names: Iterable[str], config: ExperimentConfig) -> bool:
    """True when every ``<name>.csv`` exists with a provenance JSON whose config hash equals ``config``'s and whose
    recorded sha256 (``table_sha256``, where recorded) is the CSV's: a table cut short, edited or replaced after it
    was written is not current, and is recomputed rather than reused."""
    out_dir = Path(out_dir)
    wanted = config.config_hash()
    for name in names:
        csv_path, json_path = out_dir / f"{name}.csv", out_dir / f"{name}.json"
        try:
            record = json.loads(json_path.read_text())
            if not isinstance(record, dict) or record.get("config_hash") != wanted:
                return False
            digest = record.get("table_sha256")
            data = csv_path.read_bytes()
        except (OSError, ValueError):  # missing or unreadable files, JSON that does not parse
            return False
        if digest is not None and _sha256(data) != digest:
            return False
    return True
