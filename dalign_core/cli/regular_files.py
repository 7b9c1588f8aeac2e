"""The local inputs a command reads must be what they seem: regular files inside the folders named.

A pipe (FIFO), socket or device in a model or tokenizer folder would block the library that opens it (a FIFO
that no process writes to blocks ``open`` forever), so it is refused by name; a ``--revision`` must name a
folder inside ``--model``, never one reached by ``..`` or an absolute path. (``--data`` pipes are read with a
timeout: :mod:`dalign_core.cli.examples`.)
"""

from __future__ import annotations

import os
from pathlib import Path

from dalign_core.cli.errors import LoadError

__all__ = ["check_regular_files", "check_revision_name"]


def check_revision_name(path: Path, revision: str, present: list[str]) -> None:
    """Refuse a local ``--revision`` that is not a folder name inside ``path``: an absolute path, ``.``, or one
    that climbs out with ``..`` would load a checkpoint from elsewhere than ``--model``."""
    parts = Path(revision).parts
    if Path(revision).is_absolute() or not parts or any(part in (".", "..") for part in parts) or \
            not os.path.normpath(path / revision).startswith(os.path.normpath(path) + os.sep):
        raise LoadError(
            f"--revision {revision!r} is not the name of a revision folder inside the model folder {str(path)!r} "
            "(it would load a checkpoint from outside --model); give a subfolder's name"
            + (f", one of: {', '.join(present)}" if present else "") + ", or pass that checkpoint as --model"
        )


def _special_files(folder: Path) -> list[str]:
    """Names of the entries of ``folder`` that are neither regular files nor folders (pipes, sockets, devices):
    a library that opens one to read a checkpoint or tokenizer file would block, or fail deep inside."""
    import stat

    found = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            found.append(entry.name)
    return sorted(found)


def check_regular_files(folder: Path, what: str) -> None:
    """Refuse a model or tokenizer folder that holds a pipe, socket or device (see :func:`_special_files`)."""
    special = _special_files(folder)
    if special:
        raise LoadError(f"{what} {str(folder)!r} holds {', '.join(special[:5])}, which "
                        f"{'is' if len(special) == 1 else 'are'} not a regular file (a pipe, socket or device): "
                        "reading it could block forever; replace it with the file itself")
