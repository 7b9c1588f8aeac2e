"""Profiles, the repository root (or working folder), and the base class of every experiment's config.

A profile names a scale at which every experiment runs:

* ``smoke``: seconds, for tests;
* ``cpu``: the default, a faithful small-scale reproduction on a 2-core laptop;
* ``gpu``: minutes on one GPU (each chapter within a short window);
* ``paper``: the paper's scales, hours on GPUs.

This module sits at the bottom of the library (it imports nothing of dalign_core), so
the data layer, the experiments and the command line share one list of profiles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar, Mapping

__all__ = ["PROFILES", "REPO_ROOT", "SOURCE_ROOT", "ExperimentConfig", "check_profile", "default_results_dir",
           "work_root"]

PROFILES = ("smoke", "cpu", "gpu", "paper")
"""smoke: seconds, for tests; cpu: the default reproduction on a laptop; gpu: minutes on one GPU; paper: the paper's scales."""


def _source_root() -> Path | None:
    """The source checkout this package runs from (the folder holding dalign's pyproject.toml beside the package)."""
    parent = Path(__file__).resolve().parent.parent
    pyproject = parent / "pyproject.toml"
    try:
        if pyproject.is_file() and 'name = "dalign"' in pyproject.read_text(encoding="utf-8"):
            return parent
    except OSError:  # pragma: no cover  (an unreadable file is no checkout of ours)
        pass
    return None


SOURCE_ROOT: Path | None = _source_root()
"""The repository root when dalign_core runs from a source checkout (``pip install -e .`` or the tree
itself); None when it is installed (e.g. into site-packages) without one."""


def work_root() -> Path:
    """Where ``results/``, ``checkpoints/`` and ``.cache/`` live by default.

    The repository root in a source checkout; installed without one, the current working
    directory (never the installed package's own folder).
    """
    return SOURCE_ROOT if SOURCE_ROOT is not None else Path.cwd()


REPO_ROOT = work_root()
"""The repository root (where ``results/``, ``checkpoints/`` and ``.cache/`` live by default).

Installed without a source checkout (:data:`SOURCE_ROOT` is None), the working directory at import;
:func:`work_root` gives the working directory at the time of the call."""


def check_profile(profile: str) -> str:
    """Return ``profile`` if it is one of :data:`PROFILES`, else raise ValueError listing them."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    return profile


def default_results_dir(profile: str) -> Path:
    """``results/<profile>`` at the repository root, or in the working directory when installed without a
    source checkout (see :func:`work_root`; override with ``DALIGN_RESULTS``)."""
    root = Path(os.environ.get("DALIGN_RESULTS") or work_root() / "results")
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
        """The config for ``profile`` (smoke | cpu | gpu | paper), with keyword ``overrides`` applied last."""
        check_profile(profile)
        if cls.PROFILES and profile not in cls.PROFILES:  # never run one profile's sizes under another's name
            raise ValueError(f"{cls.__qualname__} defines no settings for profile {profile!r} "
                             f"(it has {', '.join(cls.PROFILES)}); add them to its PROFILES")
        values = dict(cls.PROFILES.get(profile, {}))
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
