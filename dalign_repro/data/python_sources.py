"""A large offline corpus: the Python sources of packages the environment pins.

The context study (:mod:`dalign_repro.experiments.llama_context`) needs held-out text
for hundreds of sequences of 2,048 tokens, disjoint from the train and validation text
and from each other's pools: far more than Shakespeare's held-out works hold (about 224
sequences of 1,024 tokens). Every machine that runs this project already has such text
on disk: the ``.py`` sources of the packages ``requirements.txt`` pins exactly. They are
read from the installed distributions (``importlib.metadata``), so nothing is
downloaded, and checked against ``data_manifests/python_sources.yaml``.

**Split by whole package, not by file.** Files of one package share licence headers,
helpers and copied code; a file-level split would put near-copies of held-out text in
the training set. Each package is one "work", assigned to one split by the manifest
(``train``: scipy and pandas; ``validation``: matplotlib; ``test``: numpy), so the
held-out text is a code base the model never saw a line of.

**Exactly the pinned bytes.** A package is used only at the version the manifest names,
and its sources' digest (sha256 over the sorted relative paths and each file's sha256)
must equal the manifest's: a different version or a patched install is refused with
the command that installs the pinned one. Files a build writes per platform
(``__config__.py``, ``version.py``, ``_distributor_init*.py`` …) are left out, so the
digest is the same on every platform's wheel.

The texts are code, not prose: numbers measured on it are not comparable with the
paper's web-text models in level, only in how they move with context and width.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.metadata as metadata
from dataclasses import dataclass
from pathlib import Path

import yaml

from dalign_repro.data.manifest import manifest_dirs
from dalign_repro.data.text import SPLITS, TextCorpus, corpus_of

__all__ = ["SourcePackage", "load_python_sources", "source_packages", "sources_digest"]

MANIFEST = "python_sources.yaml"


@dataclass(frozen=True)
class SourcePackage:
    """One pinned package of the corpus: which split its sources fall into and the digest they must have."""

    name: str
    version: str
    split: str
    sha256: str
    """sha256 over the sorted ``(relative path, file sha256)`` pairs of the kept ``.py`` files."""
    files: int
    chars: int


def _manifest_path() -> Path:
    candidates = [folder / MANIFEST for folder in manifest_dirs()]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise FileNotFoundError(f"no data manifest {MANIFEST} (looked in {', '.join(str(c.parent) for c in candidates)})")
    return found


def _manifest() -> dict:
    with open(_manifest_path(), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def source_packages() -> tuple[SourcePackage, ...]:
    """The corpus's packages as the manifest lists them."""
    packages = tuple(SourcePackage(**entry) for entry in _manifest()["packages"])
    unknown = {p.split for p in packages} - set(SPLITS)
    if unknown:
        raise ValueError(f"{MANIFEST}: unknown split(s) {sorted(unknown)}; use {SPLITS}")
    return packages


def _kept(relative: str, excluded: list[str]) -> bool:
    return relative.endswith(".py") and not any(fnmatch.fnmatch(Path(relative).name, pat) for pat in excluded)


def _package_files(name: str, version: str) -> list[tuple[str, Path]]:
    """``(relative path, absolute path)`` of the installed distribution's kept ``.py`` files, sorted."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the corpus needs the package {name}=={version}, which is not installed; "
                                f"install it with: python -m pip install {name}=={version}") from None
    if dist.version != version:
        raise ValueError(f"the corpus needs {name}=={version} but {dist.version} is installed; "
                         f"install the pinned one with: python -m pip install {name}=={version}")
    excluded = list(_manifest().get("exclude", []))
    files = []
    for entry in dist.files or ():
        relative = str(entry).replace("\\", "/")
        if relative.startswith(f"{name}/") and _kept(relative, excluded):
            files.append((relative, Path(dist.locate_file(entry))))
    return sorted(files)


def sources_digest(files: list[tuple[str, bytes]]) -> str:
    """sha256 (hex) over the sorted relative paths and each file's sha256: the manifest's ``sha256`` of a package."""
    digest = hashlib.sha256()
    for relative, data in sorted(files):
        digest.update(relative.encode("utf-8") + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def read_package(package: SourcePackage, *, verify: bool = True) -> list[tuple[str, str]]:
    """The package's kept sources as ``(name, text)`` documents, checked against the manifest's digest."""
    files = [(relative, path.read_bytes()) for relative, path in _package_files(package.name, package.version)]
    if verify:
        digest = sources_digest(files)
        if digest != package.sha256:
            raise ValueError(f"the sources of {package.name}=={package.version} differ from the manifest "
                             f"({MANIFEST}: sha256 {package.sha256[:12]}…, found {digest[:12]}…): a patched or "
                             f"partial install; reinstall with: python -m pip install --force-reinstall --no-deps "
                             f"{package.name}=={package.version}")
    # Sources are UTF-8 by PEP 3120; newlines are normalized as every other corpus's are.
    return [(relative, data.decode("utf-8").replace("\r\n", "\n")) for relative, data in files]


def load_python_sources(*, verify: bool = True) -> TextCorpus:
    """The pinned packages' sources, split by whole package as the manifest says (see the module docstring)."""
    buckets: dict[str, list[tuple[str, str]]] = {split: [] for split in SPLITS}
    packages = source_packages()
    for package in packages:
        buckets[package.split] += read_package(package, verify=verify)
    rule = "whole packages, by the manifest: " + "; ".join(
        f"{split}: {', '.join(f'{p.name}=={p.version}' for p in packages if p.split == split)}" for split in SPLITS)
    source = "python-sources " + " ".join(f"{p.name}=={p.version}:{p.sha256[:12]}" for p in packages)
    return corpus_of(buckets, source=source, split_rule=rule, validation=True, what="python-sources")
