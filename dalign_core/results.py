"""Results files: tidy CSV tables with a provenance JSON beside each, written atomically.

Every experiment writes ``results/<profile>/<name>.csv`` (one row per measurement)
and ``results/<profile>/<name>.json`` (config, config hash, seed, git commit,
hardware, wall time, package versions).  The book, the benchmarks and other tools
read these files; nothing reads an experiment's in-memory state.

A file is first written under a temporary name in the same folder and then
renamed, so a reader never sees half a file and an interrupted run leaves the
previous good file in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Mapping

import pandas as pd

__all__ = [
    "PROFILES",
    "ExperimentConfig",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "provenance",
    "write_table",
    "read_table",
    "results_current",
    "default_results_dir",
]

PROFILES = ("smoke", "cpu", "paper")
"""smoke: seconds, for tests; cpu: the default small-scale reproduction on a laptop; paper: the paper's scales, for a GPU."""

_PACKAGES = ("torch", "torchvision", "numpy", "pandas", "transformers", "tokenizers", "safetensors")
REPO_ROOT = Path(__file__).resolve().parent.parent


def check_profile(profile: str) -> str:
    """Return ``profile`` if it is one of :data:`PROFILES`, else raise ValueError listing them."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    return profile


def default_results_dir(profile: str) -> Path:
    """``results/<profile>`` at the repository root (override with ``DALIGN_RESULTS``)."""
    root = Path(os.environ.get("DALIGN_RESULTS") or REPO_ROOT / "results")
    return root / check_profile(profile)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Base class of every experiment's config dataclass.

    Subclasses are frozen dataclasses with a ``profile`` and a ``seed`` field and a
    class attribute ``PROFILES`` mapping each profile name to the field values that
    differ from the defaults.  ``Config.for_profile("cpu", seed=3)`` builds one.
    """

    PROFILES: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    @classmethod
    def for_profile(cls, profile: str = "cpu", **overrides):
        """The config for ``profile`` (smoke | cpu | paper), with keyword ``overrides`` applied last."""
        values = dict(cls.PROFILES.get(check_profile(profile), {}))
        values.update(overrides)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise TypeError(f"{cls.__qualname__} has no field(s) {unknown}; fields are {sorted(names)}")
        return cls(profile=profile, **values)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-ready values."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

    def config_hash(self) -> str:
        """A short stable hash of the config: equal configs give equal hashes."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``, on error delete it.

    For writers that take a file name (``safetensors.torch.save_file``, ``Tokenizer.save``)
    as well as our own: a reader never sees half a file, and an interrupted write
    leaves the previous good file in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Text version of :func:`atomic_write_bytes` (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _git_commit() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        return {"commit": commit, "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


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
    return {
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "profile": getattr(config, "profile", None),
        "seed": getattr(config, "seed", None),
        "git": _git_commit(),
        "hardware": _hardware(),
        "wall_time_s": round(float(wall_time_s), 3),
        "versions": _versions(),
        "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }


def write_table(
    table: pd.DataFrame, out_dir: str | os.PathLike, name: str, config: ExperimentConfig, wall_time_s: float, **extra: Any
) -> Path:
    """Write ``<out_dir>/<name>.csv`` and its provenance ``<out_dir>/<name>.json``; return the CSV path.

    The JSON is written last, so its presence with a matching config hash means the
    CSV beside it is complete (see :func:`results_current`).
    """
    out_dir = Path(out_dir)
    csv_path = out_dir / f"{name}.csv"
    json_path = out_dir / f"{name}.json"
    json_path.unlink(missing_ok=True)
    atomic_write_text(csv_path, table.to_csv(index=False))
    record = provenance(config, wall_time_s, table=csv_path.name, rows=len(table), **extra)
    atomic_write_text(json_path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return csv_path


def read_table(out_dir: str | os.PathLike, name: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Read ``<name>.csv`` and its provenance; a clear error says how to produce a missing one."""
    out_dir = Path(out_dir)
    csv_path, json_path = out_dir / f"{name}.csv", out_dir / f"{name}.json"
    if not csv_path.exists() or not json_path.exists():
        raise FileNotFoundError(
            f"{csv_path} (with its provenance {json_path.name}) does not exist; run the experiment that "
            f"writes it first, e.g. `make notebooks PROFILE={out_dir.name}`"
        )
    try:
        table = pd.read_csv(csv_path)
    except pd.errors.EmptyDataError:  # an experiment with nothing to report (e.g. every run failed)
        table = pd.DataFrame()
    return table, json.loads(json_path.read_text())


def results_current(out_dir: str | os.PathLike, names: Iterable[str], config: ExperimentConfig) -> bool:
    """True when every ``<name>.csv`` exists with a provenance JSON whose config hash equals ``config``'s."""
    out_dir = Path(out_dir)
    wanted = config.config_hash()
    for name in names:
        json_path = out_dir / f"{name}.json"
        if not (out_dir / f"{name}.csv").exists() or not json_path.exists():
            return False
        try:
            if json.loads(json_path.read_text()).get("config_hash") != wanted:
                return False
        except (OSError, json.JSONDecodeError):
            return False
    return True
