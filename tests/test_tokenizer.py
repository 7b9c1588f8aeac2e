"""BPE tokenizer cache and sequence cutting per split: train, validation, test (small texts, no network)."""

from __future__ import annotations

import torch
import pytest

from dalign_repro.data.text import TextCorpus, split_documents
from dalign_repro.data.tokenizer import (
    BPESettings,
    make_sequences,
    prepare_lm_data,
    tokenizer_cache_key,
    train_bpe,
)

TEXTS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 20,
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n" * 20,
]


def test_cache_hit_and_keys(tmp_path):
    first = train_bpe(TEXTS, 320, cache_dir=tmp_path)
    assert not first.cache_hit and first.path.is_file() and first.vocab_size <= 320
    second = train_bpe(TEXTS, 320, cache_dir=tmp_path)
    assert second.cache_hit and second.path == first.path
    assert second.tokenizer.to_str() == first.tokenizer.to_str()
    # different texts, order or settings -> different keys and folders
    s = BPESettings(vocab_size=320)
    keys = {
        tokenizer_cache_key(TEXTS, s),
        tokenizer_cache_key(TEXTS[::-1], s),
        tokenizer_cache_key([TEXTS[0] + "x", TEXTS[1]], s),
        tokenizer_cache_key(TEXTS, BPESettings(vocab_size=330)),
        tokenizer_cache_key(TEXTS, BPESettings(vocab_size=320, min_frequency=3)),
    }
    assert len(keys) == 5
    other = train_bpe(TEXTS[:1], 320, cache_dir=tmp_path)
    assert not other.cache_hit and other.path != first.path
    # no temporary files left next to the cached tokenizers
    assert not [p for p in tmp_path.rglob("*.part")]


def test_roundtrip_and_eos(tmp_path):
    tok = train_bpe(TEXTS, 320, cache_dir=tmp_path)
    ids = tok.encode(TEXTS[1])
    assert ids.dtype == torch.int64 and tok.decode(ids) == TEXTS[1]
    stream = tok.encode_documents(TEXTS)
    assert int((stream == tok.eos_id).sum()) == 2 and int(stream[-1]) == tok.eos_id


def test_make_sequences():
    x = torch.arange(10)
    s = make_sequences(x, 4)
    assert s.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert make_sequences(x, 4, stride=3).tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    with pytest.raises(ValueError):
        make_sequences(x, 11)


def test_prepare_lm_data_trains_on_train_split_only(tmp_path):
    corpus = TextCorpus(train_texts=tuple(TEXTS), test_texts=("Held out: the rest is silence.\n" * 10,),
                        train_names=("a", "b"), test_names=("c",))
    data = prepare_lm_data(corpus, vocab_size=320, seq_len=16, cache_dir=tmp_path)
    assert data.train.shape[1] == 16 and data.test.shape[1] == 16 and data.test.shape[0] > 0
    assert data.tokenizer.cache_key == tokenizer_cache_key(TEXTS, BPESettings(vocab_size=320))
    again = prepare_lm_data(corpus, vocab_size=320, seq_len=16, cache_dir=tmp_path)
    assert again.tokenizer.cache_hit and torch.equal(again.train, data.train) and torch.equal(again.test, data.test)
    # a corpus without validation documents gives an empty (0, seq_len) validation tensor
    assert data.validation.shape == (0, 16) and data.validation.dtype == torch.int64
    assert data.summary()["n_validation_seqs"] == 0 and data.summary()["validation_tokens"] == 0


VALIDATION = "Friends, Romans, countrymen, lend me your ears;\nI come to bury Caesar, not to praise him.\n" * 6
HELD_OUT = "Held out: the rest is silence.\n" * 10


def test_validation_windows_come_from_validation_documents_only(tmp_path):
    corpus = split_documents(
        [("a", TEXTS[0]), ("b", TEXTS[1]), ("c", HELD_OUT), ("d", VALIDATION)] + [(f"e{i}", TEXTS[i]) for i in range(2)],
        test_every=4, test_offset=2, validation_offset=3,
    )
    assert corpus.test_names == ("c",) and corpus.validation_names == ("d",)
    data = prepare_lm_data(corpus, vocab_size=320, seq_len=16, cache_dir=tmp_path)
    # the tokenizer saw the train texts only
    assert data.tokenizer.cache_key == tokenizer_cache_key(corpus.train_texts, BPESettings(vocab_size=320))
    tok = data.tokenizer
    assert data.validation.dtype == torch.int64 and data.validation.shape[1] == 16 and len(data.validation) > 0
    assert torch.equal(data.validation, make_sequences(tok.encode_documents([VALIDATION]), 16))
    text = {split: tok.decode(getattr(data, split).flatten()) for split in ("train", "validation", "test")}
    assert "Romans" in text["validation"] and "Romans" not in text["train"] + text["test"]
    assert "silence" in text["test"] and "silence" not in text["train"] + text["validation"]
    assert "discontent" not in text["validation"] + text["test"]
    s = data.summary()
    assert s["n_validation_seqs"] == len(data.validation) and s["validation_tokens"] == data.validation.numel()
    again = prepare_lm_data(corpus, vocab_size=320, seq_len=16, cache_dir=tmp_path)
    assert torch.equal(again.validation, data.validation)


def test_a_split_shorter_than_one_sequence_is_named(tmp_path):
    corpus = TextCorpus(tuple(TEXTS), (HELD_OUT,), ("a", "b"), ("c",),
                        validation_texts=("Too short.",), validation_names=("v",))
    with pytest.raises(ValueError, match="validation split encodes to .* fewer than one sequence of seq_len=64"):
        prepare_lm_data(corpus, vocab_size=320, seq_len=64, cache_dir=tmp_path)
