"""Settings read from the environment, shared by the loaders."""

from __future__ import annotations

import os

_TRUE = ("1", "true", "yes", "on")


def hub_offline(*, include_datasets: bool = False) -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` (and, if asked, ``HF_DATASETS_OFFLINE``) is set true."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") + (("HF_DATASETS_OFFLINE",) if include_datasets else ())
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in names)
