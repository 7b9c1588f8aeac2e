"""The old path of :mod:`dalign_core.environment`, kept so that code not yet moved still imports.

New code imports :mod:`dalign_core.environment`; this alias goes once nothing names it.
"""

from __future__ import annotations

from dalign_core.environment import OFFLINE_VARIABLES, env_flag, hub_offline, offline_variable

__all__ = ["OFFLINE_VARIABLES", "env_flag", "hub_offline", "offline_variable"]
