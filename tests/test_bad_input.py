"""Bad inputs to the `dalign` command: each gives a correct answer or one line that says what is wrong and what to do.

Command-line cases go through ``dalign_core.cli.app.main`` (and one through ``python -m
dalign_core``); the API's own cases are in test_hooks.py and test_bounds.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from dalign_core.geometry.bounds import b_align
from dalign_core.cli.app import main
from dalign_core.cli.estimate import format_table
from dalign_repro.config import REPO_ROOT

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from test_cli import _train_tokenizer  # noqa: E402  (tests/ is on sys.path: the CLI tests' tokenizer helper)

TEXT = (
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate: rough winds do shake the "
    "darling buds of May, and summer's lease hath all too short a date.\n"
)
MAX_POSITIONS = 64


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """``good/`` (a tiny LLaMA with its tokenizer) and ``data.txt``; variants are copies of ``good/``."""
    root = tmp_path_factory.mktemp("bad_input")
    vocab = len(_train_tokenizer(root / "good", TEXT))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab, max_position_embeddings=MAX_POSITIONS,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(root / "good")
    (root / "data.txt").write_text(TEXT * 8, encoding="utf-8")
    return root


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _variant(root: Path, name: str) -> Path:
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(root / "good", folder)
    return folder


def _tensors(root: Path) -> dict[str, torch.Tensor]:
    return safetensors_torch.load_file(root / "good" / "model.safetensors")


def _save_tensors(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    safetensors_torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _argv(model: Path, data: Path, *extra: str, layer: str = "model.layers.1") -> list[str]:
    return ["estimate", "--model", str(model), "--layer", layer, "--data", str(data),
            "--examples", "8", "--seq-len", "16", "--quiet", *extra]


def _fails(capsys, argv: list[str], *needles: str) -> str:
    """Run the command; it must exit 1 with one line on stderr holding every needle, and print no results."""
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1, (out, err)
    assert len(lines) == 1 and lines[0].startswith("dalign: error: "), err
    assert "Traceback" not in err and "d_align" not in out
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------
# Checkpoints that do not fill the model: refused, never run with random weights


def test_renamed_tensors_are_refused_with_both_lists(root, capsys):
    folder = _variant(root, "renamed")
    _save_tensors(folder, {k.replace("model.", "transformer."): v for k, v in _tensors(root).items()})
    _fails(capsys, _argv(folder, root / "data.txt"), "does not match its config.json", "are missing",
           "model.embed_tokens.weight", "not in the model", "transformer.embed_tokens.weight", "would be random")


def test_missing_tensors_are_refused_and_listed(root, capsys):
    folder = _variant(root, "missing")
    tensors = _tensors(root)
    gone = sorted(tensors)[:3]
    _save_tensors(folder, {k: v for k, v in tensors.items() if k not in gone})
    line = _fails(capsys, _argv(folder, root / "data.txt"), "3 tensor(s) the model needs are missing")
    assert all(name in line for name in gone)


def test_unexpected_tensors_are_refused(root, capsys):
    folder = _variant(root, "extra")
    _save_tensors(folder, {**_tensors(root), "extra.weight": torch.zeros(2)})
    _fails(capsys, _argv(folder, root / "data.txt"), "not in the model (extra.weight)")


def test_tied_weights_are_not_missing(root):
    from dalign_core.cli.loading import load_model

    folder = root / "tied"
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                      vocab_size=50, max_position_embeddings=16, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    model = load_model(str(folder))
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_shapes_that_differ_from_the_config_are_refused(root, capsys):
    folder = _variant(root, "wider-config")
    _edit_config(folder, intermediate_size=96)
    _fails(capsys, _argv(folder, root / "data.txt"), "tensor shape(s) differ from the config",
           "(64, 32) in the checkpoint, (96, 32) in the config")


@pytest.mark.parametrize("damage", ["truncated", "random"])
def test_damaged_safetensors_is_one_sentence(root, capsys, damage):
    folder = _variant(root, damage)
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[:len(whole) // 2] if damage == "truncated" else os.urandom(4096))
    _fails(capsys, _argv(folder, root / "data.txt"), "is not a valid safetensors file", "truncated or corrupt")


class _NotATensor:
    def __reduce__(self):  # a pickle that would call print when loaded without weights_only
        return (print, ("this must never run",))


def test_pickle_checkpoint_refused_says_why_and_how_to_convert(root, capsys):
    folder = _variant(root, "pickled")
    (folder / "model.safetensors").unlink()
    torch.save({**_tensors(root), "surprise": _NotATensor()}, folder / "pytorch_model.bin")
    line = _fails(capsys, _argv(folder, root / "data.txt"), "was refused because loading it could run code",
                  "weights_only=False", "save_pretrained(new_folder, safe_serialization=True)")
    assert "this must never run" not in capsys.readouterr().out + line


def test_corrupt_pickle_checkpoint_is_not_called_unsafe(root, capsys):
    folder = _variant(root, "garbled-bin")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x02garbage" + os.urandom(512))
    line = _fails(capsys, _argv(folder, root / "data.txt"), str(folder))
    assert "could run code" not in line


# ---------------------------------------------------------------------------
# Tokenizer, sequence length


def test_tokenizer_larger_than_the_embedding_is_refused_at_load_time(root, capsys):
    folder = _variant(root, "small-vocab")
    _edit_config(folder, vocab_size=200)
    tensors = _tensors(root)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = tensors[name][:200].clone()
    _save_tensors(folder, tensors)
    _fails(capsys, _argv(folder, root / "data.txt"), "the tokenizer has", "embedding only 200", "--tokenizer")


def test_seq_len_beyond_the_position_count_is_refused(root, capsys):
    argv = _argv(root / "good", root / "data.txt")
    argv[argv.index("--seq-len") + 1] = str(MAX_POSITIONS + 1)
    _fails(capsys, argv, f"--seq-len {MAX_POSITIONS + 1} is longer than the {MAX_POSITIONS} positions",
           f"--seq-len {MAX_POSITIONS} or less")


# ---------------------------------------------------------------------------
# --data


def test_binary_data_is_refused(root, capsys):
    binary = root / "program"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    _fails(capsys, _argv(root / "good", binary), "looks binary", "plain text file")


def test_latin1_data_is_refused_with_the_conversion(root, capsys):
    latin = root / "latin1.txt"
    latin.write_bytes(("Les naïfs déjà vus. " * 40).encode("latin-1"))
    _fails(capsys, _argv(root / "good", latin), "is not UTF-8 text", "line 1, byte offset 6",
           f"iconv -f latin1 -t utf-8 {latin}")


def test_utf16_data_is_refused_with_the_conversion(root, capsys):
    wide = root / "utf16.txt"
    wide.write_text(TEXT * 4, encoding="utf-16")
    _fails(capsys, _argv(root / "good", wide), "is UTF-16 text", "iconv -f utf-16 -t utf-8")


def test_utf8_with_a_byte_order_mark_is_read(root, capsys):
    marked = root / "bom.txt"
    marked.write_bytes(b"\xef\xbb\xbf" + (TEXT * 8).encode("utf-8"))
    assert main(_argv(root / "good", marked)) == 0
    assert "d_align" in capsys.readouterr().out


def test_data_directory_is_named_as_such(root, capsys):
    _fails(capsys, _argv(root / "good", root), "is a directory", "needs a UTF-8 text file")


# ---------------------------------------------------------------------------
# --out: checked before the model is loaded; the CSV follows the umask


@pytest.fixture
def no_model_load(monkeypatch):
    import dalign_core.cli.loading

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(dalign_core.cli.loading, "load_model", refuse)


def test_out_directory_is_refused_before_loading(root, tmp_path, capsys, no_model_load):
    _fails(capsys, _argv(root / "good", root / "data.txt", "--out", str(tmp_path)), "is a directory",
           "give a file name")


def test_out_under_a_file_is_refused_before_loading(root, tmp_path, capsys, no_model_load):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _fails(capsys, _argv(root / "good", root / "data.txt", "--out", str(blocker / "sub" / "x.csv")),
           "cannot be created", "is a file, not a folder")


def test_unwritable_out_is_refused_before_loading(root, tmp_path, capsys, no_model_load):
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        target = locked / "x.csv"
    elif Path("/proc/self").is_dir():
        target = Path("/proc/dalign-test.csv")  # not even root can create files in /proc
    else:  # pragma: no cover
        pytest.skip("no place this user cannot write to")
    _fails(capsys, _argv(root / "good", root / "data.txt", "--out", str(target)), "cannot be written",
           "choose a folder you can write to")


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_csv_mode_follows_the_umask(root, tmp_path, capsys, umask, mode):
    out = tmp_path / "geometry.csv"
    previous = os.umask(umask)
    try:
        assert main(_argv(root / "good", root / "data.txt", "--out", str(out))) == 0
    finally:
        os.umask(previous)
    capsys.readouterr()
    assert out.stat().st_mode & 0o777 == mode


# ---------------------------------------------------------------------------
# What the results say


def test_layer_index_and_the_certificate_at_the_interval_end(root, tmp_path, capsys):
    out = tmp_path / "one.csv"
    assert main(_argv(root / "good", root / "data.txt", "--out", str(out))) == 0
    printed = capsys.readouterr().out
    row = pd.read_csv(out).iloc[0]
    assert row["layer"] == "model.layers.1" and row["layer_index"] == 1
    at_low = b_align(max(row["d_align_lo"], 0.0), row["M"], row["K"])
    assert row["b_align_at_lo"] == pytest.approx(at_low)
    assert row["b_align_lo"] <= row["b_align"] <= row["b_align_hi"] == pytest.approx(at_low)
    assert "B_align at d_align's 95% lower end (certificate)" in printed
    reaches_zero = row["d_align_lo"] <= 0
    assert ("certify nothing" in printed) == reaches_zero
    if reaches_zero:
        assert row["b_align_at_lo"] == 1.0
    # a submodule that is not a residual block has no block index
    assert main(_argv(root / "good", root / "data.txt", "--out", str(out), layer="model.layers.1.mlp")) == 0
    capsys.readouterr()
    assert pd.isna(pd.read_csv(out).loc[0, "layer_index"])


def _record(d_align_lo: float) -> dict:
    row = dict(layer="model.layers.0", n=512, d=32, reduction="shared", M=1000, K=1000, rank=1, mean_sq=1.0,
               d_par=3.0, d_2=2.0, d_align=2.0, d_align_lo=d_align_lo, d_align_hi=3.0, b_exact=0.001)
    row.update(b_align=b_align(2.0, 1000, 1000), b_align_lo=b_align(3.0, 1000, 1000),
               b_align_hi=b_align(max(d_align_lo, 0), 1000, 1000), b_align_at_lo=b_align(max(d_align_lo, 0), 1000, 1000))
    return row


def test_table_says_when_the_interval_is_too_wide_for_a_certificate():
    wide, narrow = _record(0.0), _record(1.0)
    assert "certify nothing" in format_table([wide], 0.95)
    assert "certify nothing" not in format_table([narrow], 0.95)
    ranked = format_table([wide, {**narrow, "layer": "model.layers.1", "rank": 2}], 0.95)
    assert "B_align@lo" in ranked and "at 1 of 2 layers (model.layers.0)" in ranked


def test_float64_model_runs_in_float64(root, tmp_path, capsys):
    out = tmp_path / "f64.csv"
    assert main(_argv(root / "good", root / "data.txt", "--dtype", "float64", "--out", str(out))) == 0
    capsys.readouterr()
    assert pd.read_csv(out).loc[0, "d_align"] >= 0


# ---------------------------------------------------------------------------
# The real command: one line on stderr, no traceback


def test_command_line_error_is_one_line_without_traceback(root):
    folder = _variant(root, "renamed-cli")
    _save_tensors(folder, {k.replace("model.", "transformer."): v for k, v in _tensors(root).items()})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "dalign_core", *_argv(folder, root / "data.txt")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dalign: error: the checkpoint"), proc.stderr
    assert proc.stdout == ""


# ---------------------------------------------------------------------------
# Sizes that cannot work: refused in one sentence (the estimators' array cases are in test_estimators.py)


def test_sketch_dim_larger_than_the_layer_is_one_sentence(root, capsys):
    _fails(capsys, _argv(root / "good", root / "data.txt", "--sketch-dim", "100000"),
           "sketch_dim=100000 is larger than the rows' dimension d=32", "sketch_dim=None")


@pytest.mark.parametrize("chunk", [0, -1, 1.5])
def test_digest_chunk_must_be_a_positive_size(tmp_path, chunk):
    from dalign_repro.data.manifest import sha256_file

    data = tmp_path / "data.bin"
    data.write_bytes(b"not empty")
    with pytest.raises(ValueError, match="chunk must be a positive number of bytes"):
        sha256_file(data, chunk=chunk)
    assert sha256_file(data, chunk=2) == sha256_file(data)


# ---------------------------------------------------------------------------
# --out never destroys an input, and is checked before anything is computed (issue #24)


@pytest.mark.parametrize("target", ["data", "weights", "config", "link"])
def test_out_over_an_input_is_refused_before_loading(root, tmp_path, capsys, no_model_load, target):
    folder = _variant(root, "out-over-input")
    data = tmp_path / "data.csv"  # a .csv name: refused as the input it is, not for its suffix
    data.write_text(TEXT * 8, encoding="utf-8")
    link = tmp_path / "weights.csv"
    link.symlink_to(folder / "model.safetensors")
    out = {"data": data, "weights": folder / "model.safetensors", "config": folder / ".." / folder.name / "config.json",
           "link": link}[target]
    before = {p: p.read_bytes() for p in (data, folder / "model.safetensors", folder / "config.json")}
    line = _fails(capsys, _argv(folder, data, "--out", str(out)), "an input of this command", "choose another file")
    assert ("the --data file" if target == "data" else "the model folder") in line
    assert {p: p.read_bytes() for p in before} == before


def test_out_over_the_tokenizer_folder_is_refused(root, tmp_path, capsys, no_model_load):
    tokenizer = tmp_path / "tok"
    shutil.copytree(root / "good", tokenizer)
    _fails(capsys, _argv(root / "good", root / "data.txt", "--tokenizer", str(tokenizer), "--out",
                         str(tokenizer / "tokenizer.json")), "the --tokenizer folder")


def test_an_empty_out_is_a_usage_error(root, capsys, no_model_load):
    assert main(_argv(root / "good", root / "data.txt", "--out", "")) == 2
    err = capsys.readouterr().err
    assert "argument --out: is empty; give a file name" in err and "Traceback" not in err


def test_out_over_an_existing_non_csv_or_read_only_file_is_refused_before_loading(root, tmp_path, capsys,
                                                                                  no_model_load):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    _fails(capsys, _argv(root / "good", root / "data.txt", "--out", str(notes)), "exists and is not a CSV file")
    assert notes.read_text() == "keep me"
    locked = tmp_path / "locked.csv"
    locked.write_text("a,b\n")
    locked.chmod(0o444)
    _fails(capsys, _argv(root / "good", root / "data.txt", "--out", str(locked)), "is read-only")
    assert locked.read_text() == "a,b\n"


def test_out_replaces_an_existing_csv_atomically(root, tmp_path, capsys):
    out = tmp_path / "geometry.csv"
    out.write_text("old\n")
    assert main(_argv(root / "good", root / "data.txt", "--out", str(out))) == 0
    capsys.readouterr()
    assert pd.read_csv(out).loc[0, "layer"] == "model.layers.1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["geometry.csv"]  # no temporary file left


# ---------------------------------------------------------------------------
# Options that raised from deep inside torch: one line each (issue #24)


@pytest.mark.parametrize("device", ["gpu0", "mps", "meta", "cuda:99"])
def test_a_device_that_cannot_be_used_names_the_ones_that_exist(root, capsys, no_model_load, device):
    line = _fails(capsys, _argv(root / "good", root / "data.txt", "--device", device), f"--device {device!r}")
    assert "cpu" in line and "Traceback" not in line


def test_layers_checks_the_device_too(root, capsys):
    _fails(capsys, ["layers", "--model", str(root / "good"), "--data", str(root / "data.txt"), "--device", "gpu0"],
           "--device 'gpu0'", "cuda:N")


def test_tokenizer_given_as_a_file_is_named_as_the_tokenizer(root, capsys, no_model_load):
    line = _fails(capsys, _argv(root / "good", root / "data.txt", "--tokenizer", str(root / "good" / "tokenizer.json")),
                  "--tokenizer", "is a file", "folder")
    assert "--model" not in line


def test_a_negative_seed_is_one_sentence():
    from dalign_core.cli.app import build_parser
    from dalign_core.cli.options import check_common

    args = build_parser().parse_args(["layers", "--model", "m"])
    args.seed = -1
    with pytest.raises(ValueError, match="--seed must be a whole number from 0"):
        check_common(args)


def test_ctrl_c_while_starting_is_interrupted_not_a_traceback(monkeypatch, capsys):
    import dalign_core.cli.app as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["estimate"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "dalign: interrupted"


def test_ctrl_c_while_loading_is_interrupted(root, monkeypatch, capsys):
    import dalign_core.cli.loading

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dalign_core.cli.loading, "load_model", interrupted)
    assert main(_argv(root / "good", root / "data.txt")) == 130
    assert capsys.readouterr().err.strip() == "dalign: interrupted"


# ---------------------------------------------------------------------------
# The API on batches as users build them (issue #24)


@pytest.fixture(scope="module")
def tiny_lm(root):
    return transformers.AutoModelForCausalLM.from_pretrained(root / "good").eval()


def test_int32_input_ids_and_labels_are_token_ids(tiny_lm):
    from dalign_core.capture.hooks import activation_gradients

    ids = torch.randint(0, 100, (4, 8), generator=torch.Generator().manual_seed(0))
    want = activation_gradients(tiny_lm, "model.layers.1", {"input_ids": ids})
    got = activation_gradients(tiny_lm, "model.layers.1", {"input_ids": ids.int(), "labels": ids.int()})
    assert torch.equal(got, want)


def test_labels_outside_the_vocabulary_are_refused_like_ids(tiny_lm):
    from dalign_core.capture.hooks import activation_gradients
    from dalign_core.capture.refusals import CaptureError

    ids = torch.randint(0, 100, (4, 8), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[1, 3] = 10**6
    with pytest.raises(CaptureError, match="causal-LM labels hold 1000000, outside the model's"):
        activation_gradients(tiny_lm, "model.layers.1", {"input_ids": ids, "labels": labels})
    labels[1, 3] = -100  # ignored: fine
    activation_gradients(tiny_lm, "model.layers.1", {"input_ids": ids, "labels": labels})


def test_classifier_labels_out_of_range_and_a_float64_model_given_float32_inputs():
    from torch import nn

    from dalign_core.capture.hooks import accumulate_geometry, activation_gradients
    from dalign_core.capture.refusals import CaptureError

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    want = activation_gradients(net, "0", x.double(), y)
    assert activation_gradients(net, "0", x, y.int()).dtype == torch.float64  # float32 inputs, int32 labels
    assert torch.equal(activation_gradients(net, "0", x, y), want)
    assert accumulate_geometry(net, "0", [(x, y)] * 3).result().n == 18
    with pytest.raises(CaptureError, match=r"targets \(class labels\) hold [5-7], outside the model.s 3 outputs"):
        activation_gradients(net, "0", x, y + 5)
    with pytest.raises(CaptureError, match="hold -100"):  # cross-entropy would ignore it: a loss of 0, silently
        activation_gradients(net, "0", x, torch.where(torch.arange(6) == 2, -100, y))


@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN", "encoder", "attention"])
def test_a_sequence_first_layer_is_refused_even_when_t_equals_the_batch(kind):
    from torch import nn

    from dalign_core.capture.hooks import activation_gradients
    from dalign_core.capture.refusals import CaptureError

    class SequenceFirst(nn.Module):
        def __init__(self, batch_first: bool):
            super().__init__()
            self.batch_first = batch_first
            if kind in ("GRU", "LSTM", "RNN"):
                self.body = getattr(nn, kind)(4, 4, batch_first=batch_first)
            elif kind == "encoder":
                layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0, batch_first=batch_first)
                self.body = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            else:
                self.body = nn.MultiheadAttention(4, 2, batch_first=batch_first)
            self.head = nn.Linear(4, 3)

        def forward(self, x):  # x: (batch, T, 4)
            h = x if self.batch_first else x.transpose(0, 1)
            out = self.body(h, h, h) if kind == "attention" else self.body(h)
            out = out[0] if isinstance(out, tuple) else out
            out = out if self.batch_first else out.transpose(0, 1)
            return self.head(out.mean(dim=1))

    torch.manual_seed(0)
    x, y = torch.randn(5, 5, 4), torch.randint(0, 3, (5,))  # T == batch: no shape tells the axes apart
    with pytest.raises(CaptureError, match="built with batch_first=False"):
        activation_gradients(SequenceFirst(False).eval(), "body", x, y)
    assert activation_gradients(SequenceFirst(True).eval(), "body", x, y, reduction="full").shape[0] == 5


def test_an_interval_that_cannot_be_formed_is_explained_not_printed_as_nan():
    from dalign_core.cli.estimate import format_table

    row = dict(layer="L", n=64, d=32, reduction="shared", M=10, K=10, mean_sq=-0.1, mean_sq_lo=-0.4, mean_sq_hi=0.1,
               d_par=float("inf"), d_par_lo=float("nan"), d_par_hi=float("nan"), d_2=0.001, d_2_lo=0.0,
               d_2_hi=0.004, d_align=0.001, d_align_lo=0.0, d_align_hi=0.004, b_exact=0.9, b_align=0.99,
               b_align_lo=0.9, b_align_hi=1.0, b_align_at_lo=1.0, rank=1)
    for text in (format_table([row], 0.95), format_table([row, {**row, "layer": "M", "rank": 2}], 0.95)):
        assert "nan" not in text.lower()
        assert "d_par has no interval at L" in text and "estimated at or below 0" in text


def test_a_pipe_is_a_readable_data_file_and_a_missing_one_is_named(tmp_path):
    """`--data /dev/fd/63` (a shell's process substitution) is a pipe, not a regular file: it must be accepted."""
    import os

    from dalign_core.cli.examples import check_data_file
    from dalign_core.cli.loading import LoadError

    read, write = os.pipe()
    try:
        assert check_data_file(f"/dev/fd/{read}") == Path(f"/dev/fd/{read}")
    finally:
        os.close(read)
        os.close(write)
    with pytest.raises(LoadError, match="does not exist"):
        check_data_file(tmp_path / "missing.txt")
    with pytest.raises(LoadError, match="is a directory"):
        check_data_file(tmp_path)


# ---------------------------------------------------------------------------
# rank and layers: inputs never overwritten, numbers checked, the user's builder and files named


def _rank_argv(root: Path, *extra: str) -> list[str]:
    return ["rank", "--model", str(root / "good"), "--data", str(root / "data.txt"), "--examples", "8",
            "--seq-len", "16", "--redundancy-examples", "0", "--device", "cpu", *extra]


@pytest.mark.parametrize("target", ["data", "model", "tokenizer"])
def test_rank_csv_over_an_input_is_refused_before_loading(root, tmp_path, capsys, no_model_load, target):
    data = tmp_path / "data.csv"  # a .csv text file used as --data: what `--csv <input>` would destroy
    data.write_text((root / "data.txt").read_text())
    before = data.read_bytes()
    csv = {"data": data, "model": root / "good" / "config.json", "tokenizer": root / "good" / "tokenizer.json"}[target]
    saved = csv.read_bytes()
    _fails(capsys, ["rank", "--model", str(root / "good"), "--data", str(data), "--examples", "8", "--seq-len", "16",
                    "--csv", str(csv)], "--csv", "an input of this command")
    assert csv.read_bytes() == saved and data.read_bytes() == before


def test_rank_csv_over_the_arch_inputs_is_refused(tmp_path, capsys):
    torch.save({"weight": torch.zeros(2, 2)}, tmp_path / "w.csv")
    torch.save({"inputs": torch.zeros(8, 2), "targets": torch.zeros(8, dtype=torch.long)}, tmp_path / "d.pt")
    for csv in (tmp_path / "w.csv",):
        saved = csv.read_bytes()
        _fails(capsys, ["rank", "--arch", "torch.nn:Linear", "--arch-kwargs", '{"in_features": 2, "out_features": 2}',
                        "--model", str(tmp_path / "w.csv"), "--data", str(tmp_path / "d.pt"), "--csv", str(csv)],
               "--csv", "the --model file")
        assert csv.read_bytes() == saved


@pytest.mark.parametrize("hidden", ["0", "-3", "1e8", "2.5", "wide"])
def test_rank_hidden_out_of_range_is_a_usage_error(root, capsys, no_model_load, hidden):
    assert main(_rank_argv(root, "--hidden", hidden)) == 2
    err = capsys.readouterr().err
    assert "--hidden" in err and "Traceback" not in err


def test_rank_hidden_in_scientific_notation_is_read(root):
    from dalign_core.cli.app import build_parser

    assert build_parser().parse_args(_rank_argv(root, "--hidden", "1e3")).hidden == 1000


@pytest.mark.parametrize("command", ["rank", "layers"])
def test_seq_len_zero_is_one_sentence(root, capsys, no_model_load, command):
    argv = _rank_argv(root, "--seq-len", "0") if command == "rank" else \
        ["layers", "--model", str(root / "good"), "--data", str(root / "data.txt"), "--seq-len", "0"]
    _fails(capsys, argv, "--seq-len must be at least 2")


def test_rank_arch_whose_builder_raises_is_one_sentence(tmp_path, capsys):
    torch.save({}, tmp_path / "w.pt")
    torch.save({"inputs": torch.zeros(8, 2), "targets": torch.zeros(8, dtype=torch.long)}, tmp_path / "d.pt")
    base = ["rank", "--arch", "torch.nn:Linear", "--model", str(tmp_path / "w.pt"), "--data", str(tmp_path / "d.pt")]
    _fails(capsys, base + ["--arch-kwargs", '{"in_features": -1, "out_features": 2}'], "--arch 'torch.nn:Linear' raised",
           "--arch-kwargs")
    _fails(capsys, base + ["--arch-kwargs", '{"bogus": 1}'], "raised TypeError")
    _fails(capsys, ["rank", "--arch", "math:pi", "--model", str(tmp_path / "w.pt"), "--data", str(tmp_path / "d.pt")],
           "not something to call")


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_rank_arch_with_a_truncated_state_dict_names_the_file(tmp_path, capsys, suffix):
    model = torch.nn.Linear(4, 3)
    path = tmp_path / f"state{suffix}"
    if suffix == ".pt":
        torch.save(model.state_dict(), path)
    else:
        safetensors_torch.save_file(model.state_dict(), path)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    torch.save({"inputs": torch.zeros(8, 4), "targets": torch.zeros(8, dtype=torch.long)}, tmp_path / "d.pt")
    _fails(capsys, ["rank", "--arch", "torch.nn:Linear", "--arch-kwargs", '{"in_features": 4, "out_features": 3}',
                    "--model", str(path), "--data", str(tmp_path / "d.pt")], path.name)


def test_a_full_disk_while_writing_out_is_one_sentence_and_keeps_the_old_csv(root, tmp_path, capsys, monkeypatch):
    import errno

    from dalign_core import atomic

    out = tmp_path / "geometry.csv"
    out.write_text("old results\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    assert main(_argv(root / "good", root / "data.txt", "--out", str(out))) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("dalign: error: ") and "No space left on device" in err[0], err
    assert str(out) in err[0]  # the table was printed; the file it could not write is named
    assert out.read_text() == "old results\n" and [p.name for p in tmp_path.iterdir()] == ["geometry.csv"]


# ---------------------------------------------------------------------------
# Found by scripts/user_trial.py: each a refusal in one line, where it used to pass or end in a traceback


def test_arch_data_that_does_not_fit_the_model_is_one_sentence(tmp_path, capsys):
    from torchvision.ops import MLP

    torch.manual_seed(0)
    torch.save(MLP(4, [8, 3]).state_dict(), tmp_path / "w.pt")
    torch.save({"inputs": torch.randn(12, 5), "targets": torch.zeros(12, dtype=torch.long)}, tmp_path / "d.pt")
    arch = ["--arch", "torchvision.ops:MLP", "--arch-kwargs", '{"in_channels": 4, "hidden_channels": [8, 3]}',
            "--model", str(tmp_path / "w.pt"), "--data", str(tmp_path / "d.pt"), "--layer", "0,1"]
    for argv in (["estimate", *arch, "--examples", "12", "--redundancy-examples", "0", "--quiet"],
                 ["rank", *arch, "--examples", "12", "--redundancy-examples", "0"]):
        _fails(capsys, argv, "raised RuntimeError on the --data examples", "mat1 and mat2")


def test_targets_of_another_length_than_the_inputs_are_refused():
    from dalign_core.capture.hooks import activation_gradients
    from dalign_core.capture.refusals import CaptureError

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 3))
    with pytest.raises(CaptureError, match="targets hold 7 example"):
        activation_gradients(model, "0", torch.randn(10, 4), torch.zeros(7, dtype=torch.long))


@pytest.mark.parametrize("module, field, value, needle", [
    ("interventions", "seed", -1, "seed=-1"),  # a __post_init__ of its own no longer skips the shared checks
    ("growth", "seed", -1, "seed=-1"),
    ("pythia_checkpoints", "seed", -1, "seed=-1"),
    ("llama_width", "lr_candidates", (float("nan"),), "lr_candidates=(nan,)"),
    ("llama_width", "run_sd", float("nan"), "run_sd=nan"),
    ("llama_width", "run_sd", -1.0, "run_sd=-1.0"),
    ("llama_width", "unit_contexts", (-1,), "unit_contexts=(-1,)"),
    ("resnet_width", "milestones", (0.5, float("nan")), "milestones"),
    ("llama_width", "device", "tpu9", "device='tpu9'"),
    ("llama_width", "autocast_dtype", "float8", "autocast_dtype='float8'"),
    ("pythia_checkpoints", "dtype", "int3", "dtype='int3'"),
    ("interventions", "hidden", -1, "hidden=-1"),
    ("growth", "hidden", 0, "hidden=0"),
    ("interventions", "budgets", ((0, 0),), "budgets"),
    ("interventions", "retention_budget", (0, 4), "retention_budget"),
])
def test_experiment_configs_refuse_bad_shared_fields_where_they_are_built(module, field, value, needle):
    import importlib

    config_cls = importlib.import_module(f"dalign_repro.experiments.{module}").Config
    with pytest.raises(ValueError, match="is not allowed") as caught:
        config_cls.for_profile("smoke", **{field: value})
    assert needle in str(caught.value)
    config_cls.for_profile("smoke")  # the profile's own values still build


def test_every_experiment_config_runs_the_shared_checks():
    """A config whose __post_init__ forgets super().__post_init__() would build with a negative seed."""
    import importlib
    import pkgutil

    import dalign_repro.experiments

    names = [m.name for m in pkgutil.iter_modules(dalign_repro.experiments.__path__) if not m.name.startswith("_")]
    configs = [c for c in (getattr(importlib.import_module(f"dalign_repro.experiments.{n}"), "Config", None)
                           for n in names) if c is not None]
    assert len(configs) >= 9
    for config_cls in configs:
        with pytest.raises(ValueError, match="seed=-1 is not allowed"):
            config_cls.for_profile("smoke", seed=-1)


@pytest.mark.parametrize("field, value, needle", [("dataset", "no_such_set", "unknown image set"),
                                                  ("more_datasets", ("cifar100", "no_such_set"), "unknown image set"),
                                                  ("insertion_block", "layer4.0", "not a residual block")])
def test_an_unknown_image_set_or_block_is_refused_before_any_sweep_trains(field, value, needle):
    from dalign_repro.experiments import resnet_width

    with pytest.raises(ValueError, match=needle):
        resnet_width.Config.for_profile("smoke", **{field: value})
    from dalign_repro.models.resnet import residual_block_names, resnet20

    assert resnet_width.Config.for_profile("smoke").insertion_block in residual_block_names(resnet20(16))


def test_a_bad_shared_field_on_the_command_line_is_one_line(capsys):
    from dalign_repro.experiments import interventions
    from dalign_repro.experiments._runner import main as experiment_main

    with pytest.raises(SystemExit) as exit_:
        experiment_main(interventions.Config, interventions.run, argv=["--seed", "-1", "--print-config"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "seed=-1 is not allowed" in err and "Traceback" not in err
