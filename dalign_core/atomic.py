"""Atomic file writes: a reader never sees half a file.

A file is written under a temporary name in the same folder and renamed onto its
final name (``os.replace``), so an interrupted write leaves the previous good file in
place. Results tables, checkpoints, the tokenizer cache and verified downloads all
go through :func:`atomic_path`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "replace_all", "require_writable"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``, on error delete it.

    For writers that take a file name (``safetensors.torch.save_file``, ``Tokenizer.save``)
    as well as our own: a reader never sees half a file, and an interrupted write
    leaves the previous good file in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_empty_file(path.parent, f".{path.name}.", suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _new_empty_file(folder: Path, prefix: str, suffix: str) -> Path:
    """Create an empty file under a fresh name in ``folder``.

    Unlike ``tempfile.mkstemp`` (mode 0600), it gets the mode any new file gets under
    the umask, so the renamed result is as readable as a file written directly.
    """
    while True:
        candidate = folder / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return candidate
        except FileExistsError:  # a name already taken: draw another
            continue


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename (a failure, such as
    a full disk, names ``path`` and leaves its old version in place)."""
    replace_all([(path, data)])
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Text version of :func:`atomic_write_bytes` (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def replace_all(contents: "list[tuple[str | os.PathLike, bytes]]") -> None:
    """Write several files so that none replaces its old version until all are complete.

    Each ``(path, data)`` is written in full under a temporary name beside ``path`` and
    flushed to disk; only then are the temporaries renamed onto their paths, in the order
    given. A failure while writing (a full disk: ``ENOSPC``, a read-only folder, Ctrl-C)
    deletes the temporaries and leaves every old file untouched.
    """
    written: list[tuple[Path, Path]] = []
    try:
        for path, data in contents:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = _new_empty_file(path.parent, f".{path.name}.", ".tmp")
            written.append((tmp, path))
            try:
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as err:  # name the file being written: a full disk's message names none
                if err.filename is None and err.errno is not None:
                    raise OSError(err.errno, err.strerror or str(err), str(path)) from err
                raise
        for tmp, path in written:
            os.replace(tmp, path)
    finally:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)


def require_writable(flag: str, path: "str | os.PathLike", folder: "str | os.PathLike") -> None:
    """Refuse ``path`` (named by the option ``flag``) when no file can be created in ``folder``, its nearest existing
    folder: read-only, no permission. One line, with what to do."""
    import tempfile  # noqa: PLC0415

    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ValueError(f"{flag} {str(path)!r} cannot be written: no file can be created in {str(folder)!r} "
                         f"({err.strerror or err}); choose a folder you can write to") from None
