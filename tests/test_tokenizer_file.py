"""A generic fast tokenizer read by ``tokenizers`` alone gives the ids and length transformers gives; anything
transformers would read otherwise is left to it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dalign_core.cli.loading import load_tokenizer
from dalign_core.cli.tokenizer_file import FileTokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = ("From fairest creatures we desire increase, that thereby beauty's rose might never die,\n"
        "but as the riper should by time decease — his tender heir might bear his memory. <eos> Ünïcödé 12345\n")
PROBES = [TEXT, TEXT * 3, "", " leading space", "<pad><eos>", "tab\there\n\nnew lines", "emoji 🙂 and 中文"]


def _save(folder, special_tokens=("<pad>", "<eos>"), **kwargs):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT] * 4, trainer=trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs).save_pretrained(folder)
    return folder


def _auto(folder):
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for text in PROBES:
        assert ours(text, add_special_tokens=False)["input_ids"] == theirs(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("kwargs", [
    dict(pad_token="<pad>", eos_token="<eos>"),
    dict(pad_token="<pad>", eos_token="<eos>", bos_token="<eos>"),
    dict(eos_token="<eos>", extra_special_tokens=["<sep>"]),
], ids=["pad-eos", "bos-is-eos", "extra-special"])
def test_a_generic_tokenizer_is_read_without_transformers_and_gives_its_ids(tmp_path, kwargs):
    folder = _save(tmp_path / "tok", special_tokens=("<pad>", "<eos>", "<sep>"), **kwargs)
    ours = load_tokenizer(str(folder))
    assert isinstance(ours, FileTokenizer)
    _assert_same(ours, _auto(folder))


def test_without_a_config_the_file_is_read_as_it_is(tmp_path):
    folder = _save(tmp_path / "tok", pad_token="<pad>")
    (folder / "tokenizer_config.json").unlink()
    assert isinstance(load_tokenizer(str(folder)), FileTokenizer)


@pytest.mark.parametrize("change", [
    {"tokenizer_class": "GPT2Tokenizer"},  # a model-specific class: transformers may rebuild it
    {"add_prefix_space": True},  # an option that changes the pre-tokenizer
    {"eos_token": "<end>"},  # a special token tokenizer.json lacks: transformers adds it
], ids=["specific-class", "unknown-option", "missing-special-token"])
def test_what_transformers_would_read_otherwise_is_left_to_it(tmp_path, change):
    folder = _save(tmp_path / "tok", pad_token="<pad>", eos_token="<eos>")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(change)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ours = load_tokenizer(str(folder))
    assert not isinstance(ours, FileTokenizer)
    _assert_same(ours, _auto(folder))


def test_special_tokens_are_refused_rather_than_imitated(tmp_path):
    ours = load_tokenizer(str(_save(tmp_path / "tok", pad_token="<pad>")))
    with pytest.raises(ValueError, match="add_special_tokens=False"):
        ours(TEXT)


def test_loading_a_generic_tokenizer_imports_no_transformers(tmp_path):
    folder = _save(tmp_path / "tok", pad_token="<pad>", eos_token="<eos>")
    code = ("import sys; from dalign_core.cli.loading import load_tokenizer; "
            f"t = load_tokenizer({str(folder)!r}); print(len(t), 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(len(_auto(folder))), "False"]
