"""Shared test set-up: headless plotting, no model-hub access, seeded RNGs, a private results folder."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

# These (and dalign_core/__init__) load numpy and torch, not matplotlib or huggingface_hub.
from dalign_core._env import OFFLINE_VARIABLES
from dalign_core.config import REPO_ROOT

# Before anything imports matplotlib or huggingface_hub (which read these once, at import).
# Tests never reach a model hub: whatever they need is made locally or shipped in a package.
# Set here, they also reach subprocesses and notebook kernels.
os.environ.setdefault("MPLBACKEND", "Agg")
for _name in OFFLINE_VARIABLES:
    os.environ.setdefault(_name, "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return REPO_ROOT


@pytest.fixture(autouse=True)
def _seed_everything():
    """Seed Python's, NumPy's and torch's generators before every test, so tests are repeatable."""
    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:  # pragma: no cover
        pass
    try:
        import torch
    except ImportError:  # pragma: no cover
        pass
    else:
        torch.manual_seed(0)
    yield


@pytest.fixture
def results_root(tmp_path, monkeypatch) -> Path:
    """A fresh ``DALIGN_RESULTS`` folder, so a test's results never land in the repository's results/."""
    root = tmp_path / "results"
    root.mkdir()
    monkeypatch.setenv("DALIGN_RESULTS", str(root))
    return root
