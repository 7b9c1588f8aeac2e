#!/usr/bin/env python
"""Run a command while holding a lock file, or refuse at once when another process holds it.

``make book`` and ``make notebooks`` run under it (``book/_build/.build.lock``): two builds in one folder would
execute the same chapters into ``book/chapters/`` and overwrite each other's pages. The second one stops with a
one-line message naming what to do; the lock is released when the command ends, however it ends (the operating
system drops it with the process, so a killed build leaves nothing to clean up).

Usage::

    python scripts/build_lock.py book/_build/.build.lock -- make _book
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: build_lock.py LOCKFILE -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    lock_path, command = Path(args[0]), args[2:]
    try:
        from filelock import FileLock, Timeout
    except ImportError:
        sys.exit(f"{sys.executable} cannot import filelock; run `make setup` (it is pinned in requirements.txt)")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"error: another `make book` or `make notebooks` is running in {Path.cwd()} (it holds {lock_path}); "
              "wait for it to finish, or build in another clone", file=sys.stderr)
        return 1
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())
