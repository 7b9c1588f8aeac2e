"""What ``dalign estimate`` loads and how much redundancy check it runs by default: a fast start, a cheap check."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dalign_core.cli import estimate as estimate_module
from dalign_core.cli.app import main
from dalign_core.cli.redundancy_check import QUICK_EXAMPLES

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TEXT = "the quick brown fox jumps over the lazy dog, and then it rests in the warm sun by the river bank. " * 200


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("dalign_start")
    folder = root / "tiny-llama"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    wrapped.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=len(wrapped), max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    data = root / "held_out.txt"
    data.write_text(TEXT, encoding="utf-8")
    return folder, data


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _argv(checkpoint, *extra):
    folder, data = checkpoint
    return ["estimate", "--model", str(folder), "--layer", "model.layers.0", "--data", str(data), "--seq-len", "8",
            "--batch-size", "16", "--quiet", *extra]


@pytest.fixture
def checked(monkeypatch):
    """The number of examples each redundancy check of the command ran on."""
    counts = []
    check = estimate_module.redundancy_by_layer

    def counting(model, layers, sequences, *args, **kwargs):
        counts.append(len(sequences))
        return check(model, layers, sequences, *args, **kwargs)

    monkeypatch.setattr(estimate_module, "redundancy_by_layer", counting)
    return counts


def test_the_default_check_takes_a_fraction_of_the_examples_and_the_thorough_one_all(checkpoint, checked, capsys):
    examples = 2 * QUICK_EXAMPLES + 8
    assert main(_argv(checkpoint, "--examples", str(examples))) == 0
    assert main(_argv(checkpoint, "--examples", str(examples), "--thorough-redundancy")) == 0
    assert main(_argv(checkpoint, "--examples", str(examples), "--redundancy-examples", "12")) == 0
    assert main(_argv(checkpoint, "--examples", str(examples), "--redundancy-examples", "0")) == 0
    assert checked == [QUICK_EXAMPLES, examples, 12]
    assert "redundancy" not in capsys.readouterr().err  # no warning on this model, no error


def test_thorough_and_a_count_together_are_refused_in_one_line(checkpoint, capsys):
    assert main(_argv(checkpoint, "--examples", "40", "--thorough-redundancy", "--redundancy-examples", "8")) == 1
    err = capsys.readouterr().err
    assert err.startswith("dalign: error: --thorough-redundancy") and err.count("\n") == 1


def test_the_command_reads_a_plain_llama_and_a_generic_tokenizer_without_importing_transformers(checkpoint):
    """What the start-up no longer pays for: AutoTokenizer's class lookup, and transformers' model classes with the
    torch._dynamo they import (the folder's LLaMA is built by dalign_core.cli.llama)."""
    code = ("import sys; from dalign_core.cli.app import main; "
            f"status = main({_argv(checkpoint, '--examples', '20', '--redundancy-examples', '0')!r}); "
            "print(status, sorted(m for m in sys.modules if m.split('.')[0] == 'transformers' "
            "or m.startswith('torch._dynamo')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"}).stdout.strip().splitlines()[-1]
    assert out == "0 []"
