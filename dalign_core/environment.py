"""On/off settings read from the environment: the library's one parser of such flags, read by both packages.

The Hugging Face offline variables are read here at call time (huggingface_hub and
datasets read them once, at import), with the values huggingface_hub counts as
true, so the loaders and the data layer agree with those libraries about whether
they will try the network.
"""

from __future__ import annotations

import os

__all__ = ["OFFLINE_VARIABLES", "env_flag", "hub_offline", "offline_variable"]

_TRUE = ("1", "true", "yes", "on")

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
"""The variables that keep the model hub offline; the last applies to data sets only."""


def env_flag(name: str) -> bool:
    """True when environment variable ``name`` is 1, true, yes or on (any case); unset or anything else is False."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def offline_variable(*, include_datasets: bool = False) -> str | None:
    """The first of ``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE`` (and, if asked,
    ``HF_DATASETS_OFFLINE``) that is set true, or None: for messages that name it."""
    names = OFFLINE_VARIABLES if include_datasets else OFFLINE_VARIABLES[:2]
    return next((name for name in names if env_flag(name)), None)


def hub_offline(*, include_datasets: bool = False) -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` (and, if asked, ``HF_DATASETS_OFFLINE``) is set true."""
    return offline_variable(include_datasets=include_datasets) is not None
