"""The command line's own error: what could not be loaded, and what to do (one line, never a traceback)."""

from __future__ import annotations

__all__ = ["LoadError"]


class LoadError(RuntimeError):
    """A model, tokenizer or data set could not be loaded; the message says what to do."""
