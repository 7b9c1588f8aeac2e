"""An engineer's own model, round three: inputs the model would swallow, losses that couple examples,
files checked by content, inputs that never arrive, the model's own exceptions in one line, and the API's checks
before the forward pass. Each test fails on the code before that issue."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dalign_core.capture.hooks import activation_gradients
from dalign_core.capture.refusals import CaptureError, ModelError
from dalign_core.cli.app import build_parser, main

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_cli import TEXT, _train_tokenizer  # noqa: E402  (tests/ is on sys.path)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny GPT-2 saved with its tokenizer, and held-out text."""
    root = tmp_path_factory.mktemp("own_model")
    tokenizer = _train_tokenizer(root / "gpt2")
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=len(tokenizer), n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0)).save_pretrained(root / "gpt2")
    (root / "data.txt").write_text(TEXT * 6, encoding="utf-8")
    return root


def _estimate(folder: Path, *extra: str, data: Path | None = None) -> list[str]:
    return ["estimate", "--model", str(folder / "gpt2"), "--layer", "transformer.h.1", "--data",
            str(data or folder / "data.txt"), "--seq-len", "16", "--examples", "8", "--redundancy-examples", "0",
            "--quiet", "--device", "cpu", *extra]


def _one_line_error(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("dalign: error: ") and "Traceback" not in err[0], err
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


# -- batch keys the model's forward does not take -------------------------------------------------------------


def test_a_misspelt_batch_key_is_refused_where_the_model_would_swallow_it(gpt2):
    ids = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    with pytest.raises(CaptureError, match=r"'atention_mask' is not an argument of GPT2LMHeadModel\.forward.*"
                                           r"did you mean 'attention_mask'"):
        activation_gradients(gpt2, "transformer.h.1", {"input_ids": ids, "atention_mask": mask})
    right = activation_gradients(gpt2, "transformer.h.1", {"input_ids": ids, "attention_mask": mask})
    alone = activation_gradients(gpt2, "transformer.h.1", {"input_ids": ids[:1, :6]})
    torch.testing.assert_close(right[:1], alone, rtol=2e-4, atol=1e-7)  # the spelt key masks the padding
    taken = activation_gradients(gpt2, "transformer.h.1", {"input_ids": ids, "attention_mask": mask,
                                                          "return_dict": True, "output_attentions": False})
    torch.testing.assert_close(taken, right)  # keys its decorators and TransformersKwargs read are not refused


def test_a_plain_module_with_kwargs_refuses_a_near_name_and_warns_of_an_unknown_one():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Linear(4, 3)

        def forward(self, x, mask=None, **kwargs):
            return self.block(x if mask is None else x * mask)

    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    with pytest.raises(CaptureError, match="did you mean 'mask'"):
        activation_gradients(Model().eval(), "block", {"x": x, "maks": torch.ones_like(x)}, y)
    with pytest.warns(UserWarning, match="'weights' is not a named argument of Model.forward"):
        activation_gradients(Model().eval(), "block", {"x": x, "weights": x}, y)
    with pytest.raises(CaptureError, match="keys must be strings"):
        activation_gradients(Model().eval(), "block", {"x": x, 3: x}, y)


def test_a_data_parallel_wrapper_is_checked_against_the_module_it_wraps():
    inner = torch.nn.Sequential(torch.nn.Linear(4, 3))

    class Keyed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = inner

        def forward(self, features):
            return self.net(features)

    model = torch.nn.DataParallel(Keyed().eval().to("cuda" if torch.cuda.is_available() else "cpu"))
    with pytest.raises(CaptureError, match="'feature' is not an argument of Keyed.forward"):
        activation_gradients(model, "module.net.0", {"feature": torch.randn(5, 4)}, torch.zeros(5, dtype=torch.long))


# -- losses that couple the examples ---------------------------------------------------------------------------


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).eval()


def test_a_loss_that_couples_the_examples_is_refused_with_the_reason():
    model, x, y = _mlp(), torch.randn(7, 6), torch.randint(0, 3, (7,))

    def centred(output, targets):
        losses = F.cross_entropy(output, targets, reduction="none")
        return losses - losses.mean()

    with pytest.raises(CaptureError, match="couples the examples.*every q would be exactly 0"):
        activation_gradients(model, "0", x, y, loss_fn=centred)
    with pytest.raises(CaptureError, match="couples the examples"):  # a batch statistic inside the loss
        activation_gradients(model, "0", x, y, loss_fn=lambda o, t: F.cross_entropy(o - o.mean(0), t,
                                                                                   reduction="none"))
    own = activation_gradients(model, "0", x, y, loss_fn=lambda o, t: F.cross_entropy(o, t, reduction="none"))
    torch.testing.assert_close(own, activation_gradients(model, "0", x, y))  # a separable loss is taken


def test_a_separable_loss_on_a_transformers_output_is_taken(gpt2):
    ids = torch.randint(0, 64, (3, 8), generator=torch.Generator().manual_seed(2))

    def next_token(output, targets):
        return F.cross_entropy(output.logits[:, :-1].transpose(1, 2), targets[:, 1:], reduction="none").mean(1)

    got = activation_gradients(gpt2, "transformer.h.0", ids, ids, loss_fn=next_token)
    torch.testing.assert_close(got, activation_gradients(gpt2, "transformer.h.0", {"input_ids": ids}),
                               rtol=1e-4, atol=1e-7)


def test_what_a_loss_fn_returns_or_raises_is_the_projects_error():
    model, x, y = _mlp(), torch.randn(5, 6), torch.randint(0, 3, (5,))
    for loss_fn, needle in ((lambda o, t: 1.0, "must return a tensor"), (lambda o, t: t, "floating"),
                            (lambda o, t: F.cross_entropy(o, t), r"shape \(batch,\).*got \(\).*reduction='none'")):
        with pytest.raises(CaptureError, match=needle):
            activation_gradients(model, "0", x, y, loss_fn=loss_fn)
    with pytest.raises(ModelError, match="loss_fn raised AttributeError"):
        activation_gradients(model, "0", x, y, loss_fn=lambda o, t: o.no_such_thing)


# -- the API's checks before the forward pass ------------------------------------------------------------------


def test_the_api_refuses_a_call_it_cannot_differentiate_and_takes_no_grad():
    model, x, y = _mlp(), torch.randn(5, 6), torch.randint(0, 3, (5,))
    with torch.inference_mode(), pytest.raises(CaptureError, match="inside torch.inference_mode"):
        activation_gradients(model, "0", x, y)
    with torch.no_grad():
        under = activation_gradients(model, "0", x, y)
    torch.testing.assert_close(under, activation_gradients(model, "0", x, y))
    with torch.device("meta"):
        empty = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    with pytest.raises(CaptureError, match="meta device"):
        activation_gradients(empty, "0", x, y)
    with torch.inference_mode():
        frozen = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    with pytest.raises(CaptureError, match="created inside torch.inference_mode"):
        activation_gradients(frozen, "0", x, y)


@pytest.mark.parametrize("targets, needle", [
    (torch.zeros(5, 1, dtype=torch.long), r"class indices of shape \(5,\).*view\(-1\)"),
    (torch.zeros(5), r"class probabilities and must have the logits' shape \(5, 3\).*\.long\(\)"),
    (torch.zeros(5, dtype=torch.bool), "class indices"),
])
def test_classifier_targets_are_checked_before_cross_entropy(targets, needle):
    with pytest.raises(CaptureError, match=needle):
        activation_gradients(_mlp(), "0", torch.randn(5, 6), targets)


def test_token_batches_are_checked_before_the_forward(gpt2):
    ids = torch.randint(0, 64, (2, 8))
    with pytest.raises(CaptureError, match=r"2-D tensor \(batch, T\).*ids\[None\]|input_ids\[None\]"):
        activation_gradients(gpt2, "transformer.h.0", {"input_ids": ids[0]})
    with pytest.raises(CaptureError, match="position_ids hold 40, outside the model's positions 0..31"):
        activation_gradients(gpt2, "transformer.h.0", {"input_ids": ids, "position_ids": torch.arange(33, 41)[None]})
    with pytest.raises(CaptureError, match="position_ids must be an integer tensor"):
        activation_gradients(gpt2, "transformer.h.0", {"input_ids": ids, "position_ids": torch.zeros(2, 8)})


def test_the_models_own_exception_is_a_model_error_naming_the_submodule():
    class Patches(torch.nn.Module):
        def forward(self, x):
            assert x.shape[-1] == 6, f"Wrong image width {x.shape[-1]}: expected 6"
            return x

    model = torch.nn.Sequential(Patches(), torch.nn.Linear(6, 3)).eval()
    with pytest.raises(ModelError, match=r"Sequential raised AssertionError in its submodule '0' \(Patches\).*"
                                         r"inputs of shape \(4, 5\).*Wrong image width 5") as caught:
        activation_gradients(model, "1", torch.randn(4, 5), torch.zeros(4, dtype=torch.long))
    assert isinstance(caught.value.__cause__, AssertionError) and caught.value.where == "0"
    with pytest.raises(ModelError, match="mat1 and mat2 must have the same dtype"):  # integer features
        activation_gradients(_mlp(), "0", torch.ones(4, 6, dtype=torch.long), torch.zeros(4, dtype=torch.long))


# -- the command line: the model's exceptions, --out by content, streams, --revision ----------------------------

def _own_models_module_text() -> str:
    """The engineer's own models of scripts/user_trial_own_model.py (``OWN_MODULE``: a ViT-like ``patchy`` whose
    patch embedding asserts the image size, and ``deaf``, whose ``blocks.1`` never reaches the loss)."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "scripts" / "user_trial_own_model.py"
    spec = importlib.util.spec_from_file_location("_user_trial_own_model_for_tests", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OWN_MODULE


@pytest.fixture
def arch(tmp_path, monkeypatch):
    (tmp_path / "ownmods.py").write_text(_own_models_module_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("ownmods", None)
    import ownmods

    torch.save(ownmods.patchy().state_dict(), tmp_path / "patchy.pt")
    generator = torch.Generator().manual_seed(3)
    for size in (8, 6):
        torch.save({"inputs": torch.randn(12, 1, size, size, generator=generator),
                    "targets": torch.randint(0, 3, (12,), generator=generator)}, tmp_path / f"images{size}.pt")
    return tmp_path


def _arch_argv(root: Path, command: str, *extra: str, builder: str = "ownmods:patchy", data: str = "images8.pt"):
    argv = [command, "--arch", builder, "--model", str(root / "patchy.pt"), "--data", str(root / data),
            "--examples", "12", "--redundancy-examples", "0", "--device", "cpu", *extra]
    return argv + (["--quiet"] if command == "estimate" else [])


@pytest.mark.parametrize("command", ["estimate", "rank"])
def test_an_arch_models_assertion_is_one_line_naming_the_model_and_its_submodule(arch, capsys, command):
    _one_line_error(capsys, _arch_argv(arch, command, "--layer", "blocks.1,head", data="images6.pt"),
                    "--arch ownmods:patchy raised AssertionError", "'patches' (Patches)", "doesn't match model (8)",
                    "--image-size")


def test_any_exception_type_of_the_model_is_one_line(arch, capsys):
    _one_line_error(capsys, _arch_argv(arch, "estimate", "--layer", "blocks.1", "--arch-kwargs", '{"fail": "key"}'),
                    "raised KeyError", "in its forward")


def test_an_all_zero_q_is_said_in_words(arch, capsys):
    assert main(_arch_argv(arch, "estimate", "--layer", "blocks.1", builder="ownmods:deaf")) == 0
    out = capsys.readouterr().out
    assert "q is exactly 0 for every example at blocks.1" in out and "more examples will not change that" in out
    assert "use more examples" not in out  # the interval note would say the opposite


def test_a_sketch_no_smaller_than_d_is_said_in_words(arch, capsys):
    assert main(_arch_argv(arch, "estimate", "--layer", "blocks.1", "--sketch-dim", "16")) == 0
    assert "--sketch-dim 16 is not smaller than q's dimension d=16" in capsys.readouterr().out
    assert main(_arch_argv(arch, "estimate", "--layer", "blocks.1", "--sketch-dim", "8")) == 0
    assert "not smaller than" not in capsys.readouterr().out


def test_out_named_csv_that_holds_binary_data_is_refused_and_kept(folder, tmp_path, capsys, monkeypatch):
    import dalign_core.cli.loading

    monkeypatch.setattr(dalign_core.cli.loading, "load_model", lambda *a, **k: pytest.fail("loaded before --out"))
    for content, needle in ((b"PK\x03\x04" + bytes(range(256)) * 4, "binary data"),
                            ("caf\u00e9,1\n".encode("latin-1"), "not UTF-8 text")):
        notes = tmp_path / "notes.csv"
        notes.write_bytes(content)
        _one_line_error(capsys, _estimate(folder, "--out", str(notes)), "named .csv but", needle)
        assert notes.read_bytes() == content


def test_out_over_a_csv_text_file_is_still_replaced(folder, tmp_path, capsys):
    old = tmp_path / "old.csv"
    old.write_text("layer,d_align\nx,1\n")
    assert main(_estimate(folder, "--out", str(old))) == 0
    assert "transformer.h.1" in old.read_text()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_pipe_nobody_writes_to_is_refused_after_the_wait(folder, tmp_path, capsys, monkeypatch):
    fifo = tmp_path / "silent.txt"
    os.mkfifo(fifo)
    monkeypatch.setenv("DALIGN_DATA_TIMEOUT", "0.5")
    _one_line_error(capsys, _estimate(folder, data=fifo), "is a pipe (FIFO)", "nothing arrived on it within 0.5 s")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_pipe_that_is_written_is_read(folder, tmp_path, capsys):
    import threading

    fifo = tmp_path / "stream.txt"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(TEXT * 6, encoding="utf-8"))
    writer.start()
    try:
        assert main(_estimate(folder, data=fifo)) == 0
    finally:
        writer.join(timeout=10)
    assert "d_align" in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_pipe_inside_the_model_folder_or_as_arch_inputs_is_refused(folder, arch, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(folder / "gpt2", model)
    (model / "tokenizer.json").unlink()
    os.mkfifo(model / "tokenizer.json")
    argv = [a if a != str(folder / "gpt2") else str(model) for a in _estimate(folder)]
    _one_line_error(capsys, argv, "tokenizer.json", "not a regular file")
    os.mkfifo(arch / "pipe.pt")
    _one_line_error(capsys, _arch_argv(arch, "estimate", "--layer", "blocks.1", data="pipe.pt"), "not a regular file")
    args = _arch_argv(arch, "estimate", "--layer", "blocks.1")
    args[args.index("--model") + 1] = str(arch / "pipe.pt")
    _one_line_error(capsys, args, "not a regular file")


@pytest.mark.parametrize("revision", ["..", "../gpt2", "/tmp", ".", "a/../.."])
def test_a_revision_that_climbs_out_of_the_model_folder_is_refused(folder, capsys, revision):
    layout = folder / "layout"
    (layout / "step1").mkdir(parents=True, exist_ok=True)
    argv = [a if a != str(folder / "gpt2") else str(layout) for a in _estimate(folder)] + ["--revision", revision]
    _one_line_error(capsys, argv, f"--revision {revision!r} is not the name of a revision folder", "outside --model")


def test_rank_and_layers_take_quiet(folder, capsys, monkeypatch):
    from dalign_core.cli import rank as rank_module

    seen = []
    real = rank_module.with_progress
    monkeypatch.setattr(rank_module, "with_progress", lambda b, d, progress=True: seen.append(progress) or
                        real(b, d, progress))
    argv = ["rank", "--model", str(folder / "gpt2"), "--data", str(folder / "data.txt"), "--seq-len", "16",
            "--examples", "8", "--redundancy-examples", "4", "--device", "cpu"]
    assert build_parser().parse_args([*argv, "--quiet"]).quiet
    assert build_parser().parse_args(["layers", "--model", "m", "-q"]).quiet
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*argv, "--quiet"]) == 0 and main(argv) == 0
    assert seen == [False, True]
