"""BPE tokenizer cache and sequence cutting (small texts, no network)."""

from __future__ import annotations

import torch
import pytest

from dalign_core.data.text import TextCorpus
from dalign_core.data.tokenizer import (
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
