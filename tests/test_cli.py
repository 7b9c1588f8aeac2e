"""The `dalign` command end to end on a tiny checkpoint saved in the test, offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from dalign_core.cli.app import main
from dalign_core.cli.estimate import CSV_COLUMNS
from dalign_repro.config import REPO_ROOT

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = (
    "From fairest creatures we desire increase, that thereby beauty's rose might never die, "
    "but as the riper should by time decease, his tender heir might bear his memory. "
    "But thou, contracted to thine own bright eyes, feed'st thy light's flame with self-substantial fuel, "
    "making a famine where abundance lies, thyself thy foe, to thy sweet self too cruel.\n"
)


def _train_tokenizer(folder: Path, text: str = TEXT) -> transformers.PreTrainedTokenizerFast:
    """A 300-token byte-level BPE trained on ``text``, saved in ``folder`` as transformers reads it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text] * 4, trainer=trainer)
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    wrapped.save_pretrained(folder)
    return wrapped


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("dalign_cli")
    folder = root / "tiny-llama"
    tokenizer = _train_tokenizer(folder)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=len(tokenizer), max_position_embeddings=128,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    assert (folder / "model.safetensors").exists()
    data = root / "held_out.txt"
    data.write_text(TEXT * 6, encoding="utf-8")
    return folder, data


@pytest.fixture(scope="module")
def pythia_checkpoint(tmp_path_factory):
    """A 2-layer, width-32 GPT-NeoX (Pythia architecture) whose block outputs end with a trained bias."""
    from dalign_repro.models.pythia import build_pythia, pythia_width_variant

    folder = tmp_path_factory.mktemp("dalign_cli_pythia") / "tiny-pythia"
    tokenizer = _train_tokenizer(folder)
    config = pythia_width_variant("pythia-14m", 32, vocab_size=len(tokenizer), num_layers=2, context=64)
    build_pythia(config, seed=0).save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def test_estimate_one_layer_prints_table_and_writes_csv(checkpoint, tmp_path, capsys):
    folder, data = checkpoint
    out = tmp_path / "sub" / "one.csv"
    rc = main(["estimate", "--model", str(folder), "--layer", "model.layers.1", "--data", str(data),
               "--examples", "12", "--seq-len", "16", "--batch-size", "5", "--m", "100", "--k", "50",
               "--out", str(out), "--quiet"])
    printed, err = capsys.readouterr()
    assert rc == 0
    for label in ("layer model.layers.1", "||mu||^2", "d_par", "d_2", "d_align", "95% CI",
                  "B_exact (M=100, K=50)", "B_align (M=100, K=50)"):
        assert label in printed, label
    table = pd.read_csv(out)
    assert list(table.columns[:len(CSV_COLUMNS)]) == CSV_COLUMNS
    assert len(table) == 1
    row = table.iloc[0]
    assert row["layer"] == "model.layers.1" and row["n"] == 12 and row["d"] == 32
    assert row["M"] == 100 and row["K"] == 50
    assert 0 <= row["b_exact"] <= row["b_align"] + 1e-12 <= 1 + 1e-12
    assert 0 <= row["redundancy"] <= 1  # LLaMA has no bias that owns q
    assert "warning:" not in err
    assert not list(out.parent.glob(".*tmp"))  # no temporary file left behind


def test_estimate_all_layers_ranked(checkpoint, tmp_path, capsys):
    folder, data = checkpoint
    out = tmp_path / "all.csv"
    rc = main(["estimate", "--model", str(folder), "--layer", "all", "--data", str(data),
               "--examples", "10", "--seq-len", "12", "--batch-size", "4", "--reduction", "full",
               "--out", str(out), "--quiet"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "ranked by d_align" in printed
    table = pd.read_csv(out)
    assert sorted(table["layer"]) == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert list(table["rank"]) == [1, 2, 3]
    assert table["d_align"].is_monotonic_decreasing
    assert (table["d"] == 12 * 32).all()
    # the printed table lists the layers in rank order
    positions = [printed.index(name) for name in table["layer"]]
    assert positions == sorted(positions)


def test_python_dash_m_runs_the_same_command(checkpoint, tmp_path):
    folder, data = checkpoint
    out = tmp_path / "m.csv"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "dalign_core", "estimate", "--model", str(folder), "--layer", "model.layers.0",
         "--data", str(data), "--examples", "8", "--seq-len", "16", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "d_align" in proc.stdout
    assert pd.read_csv(out).loc[0, "n"] == 8


def test_unknown_hub_id_offline_fails_fast_with_instructions(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT), "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [sys.executable, "-m", "dalign_core", "estimate", "--model", "no-such-org/no-such-model", "--layer", "all",
         "--data", str(tmp_path / "x.txt"), "--examples", "8"],
        capture_output=True, text=True, timeout=120, env=env,  # a hang would raise TimeoutExpired
    )
    assert proc.returncode != 0
    message = proc.stderr
    assert "no-such-org/no-such-model" in message
    assert "HF_HUB_OFFLINE" in message and "hf download" in message and "--model" in message
    assert "Traceback" not in message


def test_clear_errors(checkpoint, tmp_path, capsys):
    folder, data = checkpoint
    base = ["estimate", "--data", str(data), "--examples", "8", "--seq-len", "16", "--quiet"]
    # unknown layer: nearest names are listed
    assert main(base + ["--model", str(folder), "--layer", "model.layer.1"]) == 1
    assert "nearest names: model.layers.1" in capsys.readouterr().err
    # a checkpoint folder without a tokenizer
    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((folder / name).read_bytes())
    assert main(base + ["--model", str(bare), "--layer", "all"]) == 1
    err = capsys.readouterr().err
    assert "has no tokenizer" in err and "--tokenizer" in err
    # ... which --tokenizer fixes
    assert main(base + ["--model", str(bare), "--tokenizer", str(folder), "--layer", "model.layers.2"]) == 0
    capsys.readouterr()
    # a missing model folder and a missing data file
    assert main(base + ["--model", str(tmp_path / "nowhere"), "--layer", "all"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["estimate", "--model", str(folder), "--layer", "all", "--data", str(tmp_path / "none.txt"),
                 "--examples", "8", "--quiet"]) == 1
    assert "does not exist" in capsys.readouterr().err
    # too few examples
    assert main(base[:3] + ["--examples", "3", "--model", str(folder), "--layer", "all"]) == 1
    assert "at least 5" in capsys.readouterr().err


def test_a_missing_optional_package_is_one_line_that_says_how_to_install_it(pythia_checkpoint, checkpoint,
                                                                             monkeypatch, capsys):
    """A GPT-NeoX folder needs transformers (the hf extra), which the core does not require: where it is missing the
    command says so and how to install it, not that the model or its data failed."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails as if not installed
    code = main(["estimate", "--model", str(pythia_checkpoint), "--layer", "gpt_neox.layers.0", "--data",
                 str(checkpoint[1]), "--examples", "8", "--seq-len", "16", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "needs the Python package 'transformers', which is not installed here: pip install 'dalign[hf]'" in err


def test_layers_command_lists_decoder_layers(checkpoint, capsys):
    folder, _ = checkpoint
    assert main(["layers", "--model", str(folder)]) == 0
    assert capsys.readouterr().out.split() == ["model.layers.0", "model.layers.1", "model.layers.2"]


def test_offline_flags_are_parsed_in_one_place(monkeypatch):
    from dalign_core.environment import env_flag, hub_offline, offline_variable

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert not hub_offline(include_datasets=True) and offline_variable(include_datasets=True) is None
    for value, expected in [("1", True), (" Yes ", True), ("ON", True), ("true", True),
                            ("0", False), ("", False), ("off", False), ("auto", False)]:
        monkeypatch.setenv("TRANSFORMERS_OFFLINE", value)
        assert env_flag("TRANSFORMERS_OFFLINE") is expected, value
        assert hub_offline() is expected, value
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # applies to data sets, not to models
    assert offline_variable() is None and offline_variable(include_datasets=True) == "HF_DATASETS_OFFLINE"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert offline_variable(include_datasets=True) == "HF_HUB_OFFLINE"


def test_offline_message_names_the_variable_that_is_set(monkeypatch):
    from dalign_core.cli.loading import LoadError, resolve_model_source

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    with pytest.raises(LoadError, match="TRANSFORMERS_OFFLINE is set") as info:
        resolve_model_source("no-such-org/no-such-model")
    assert "unset TRANSFORMERS_OFFLINE" in str(info.value) and "HF_HUB_OFFLINE" not in str(info.value)


def test_estimate_warns_when_q_is_a_trained_parameters_gradient(pythia_checkpoint, checkpoint, tmp_path, capsys):
    _, data = checkpoint
    base = ["estimate", "--model", str(pythia_checkpoint), "--layer", "gpt_neox.layers.0", "--data", str(data),
            "--examples", "24", "--seq-len", "12", "--batch-size", "8", "--quiet"]
    out = tmp_path / "shared.csv"
    assert main(base + ["--out", str(out)]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1, err
    assert "gpt_neox.layers.0.mlp.dense_4h_to_h.bias" in warning[0] and "--reduction full" in warning[0]
    row = pd.read_csv(out).iloc[0]
    assert row["redundancy"] == pytest.approx(1.0)
    assert row["redundant_with"] == "gpt_neox.layers.0.mlp.dense_4h_to_h.bias"
    # the full q is not owned by any parameter: no warning, a low fraction
    out_full = tmp_path / "full.csv"
    assert main(base + ["--reduction", "full", "--out", str(out_full)]) == 0
    assert "warning:" not in capsys.readouterr().err
    row = pd.read_csv(out_full).iloc[0]
    assert row["redundancy"] < 0.9 and pd.isna(row["redundant_with"])
    # the check can be skipped, and a too-small sample is refused
    assert main(base + ["--redundancy-examples", "0", "--out", str(out)]) == 0
    assert "warning:" not in capsys.readouterr().err and pd.isna(pd.read_csv(out).loc[0, "redundancy"])
    assert main(base + ["--redundancy-examples", "2"]) == 1
    assert "--redundancy-examples" in capsys.readouterr().err


def test_layers_with_data_shows_each_blocks_redundancy(pythia_checkpoint, checkpoint, capsys):
    folder, data = checkpoint
    options = ["--data", str(data), "--seq-len", "12", "--redundancy-examples", "24", "--batch-size", "8"]
    assert main(["layers", "--model", str(pythia_checkpoint)] + options) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines() if not line.startswith("wrote ")), printed  # not the path
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.startswith("gpt_neox.layers.")}
    assert set(rows) == {"gpt_neox.layers.0", "gpt_neox.layers.1"}
    for name, cells in rows.items():
        assert float(cells[1]) == pytest.approx(1.0) and float(cells[2]) < 0.9  # shared owned, full not
        assert cells[3] == "*" and cells[4] == f"{name}.mlp.dense_4h_to_h.bias"
    # LLaMA has no biases: no block's shared q is owned
    assert main(["layers", "--model", str(folder)] + options) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("model.layers.")]
    assert len(rows) == 3 and all(float(r[1]) < 0.9 and r[-1] == "-" for r in rows)
    assert main(["layers", "--model", str(folder), "--all-modules", "--data", str(data)]) == 1
    assert "--all-modules" in capsys.readouterr().err


def _rank_lines(printed: str) -> dict[str, list[str]]:
    """The ``dalign rank`` orders: predictor label -> point numbers, best first (wrapped lines joined); an order the
    command names as d_align's ("same order as d_align: ...") is d_align's."""
    orders, label, same = {}, None, ""
    for line in printed.split("order by each predictor", 1)[1].splitlines()[1:]:
        if not line.strip():
            break  # the orders end at the first blank line (then: what the growth results say)
        if line.startswith("same order as d_align:") or same:
            same += line.split(":", 1)[-1] + " "
            continue
        if not line.startswith(" "):
            label, line = line.split()[0], line[len(line.split()[0]):]
            orders[label] = []
        orders[label] += [cell for cell in line.replace(">", " ").replace("=", " ").split()]
    for name in (n.strip() for n in same.split(",") if n.strip()):
        orders[name] = orders["d_align"]
    return orders


def test_rank_orders_the_blocks_of_a_saved_model(checkpoint, tmp_path, capsys):
    folder, data = checkpoint
    out = tmp_path / "rank.csv"
    rc = main(["rank", "--model", str(folder), "--data", str(data), "--examples", "16", "--seq-len", "12",
               "--batch-size", "8", "--budgets", "2,8", "--redundancy-examples", "8", "--csv", str(out)])
    printed, err = capsys.readouterr()
    assert rc == 0, err
    assert all(len(line) <= 80 for line in printed.splitlines() if not line.startswith("wrote ")), printed  # not the path
    orders = _rank_lines(printed)
    assert set(orders) == {"d_align", "d_par", "d_2", "||mu||^2", "mu.g@2", "mu.g@8", "B_align@2", "B_align@8",
                           "|grad|"}
    assert all(sorted(o) == ["0", "1", "2"] for o in orders.values())
    assert orders["d_align"] == orders["B_align@2"] == orders["B_align@8"]
    assert "B_align@2" in printed.split("same order as d_align:", 1)[1]  # an order that repeats d_align's, named once
    assert "recommended by d_align: #" in printed and "say of d_align as a guide" in " ".join(printed.split())
    table = pd.read_csv(out)
    assert list(table.layer) == ["model.layers.0", "model.layers.1", "model.layers.2"]
    for name in ("d_align", "grad_norm", "alignment_8", "b_align_8"):
        assert {name, f"{name}_lo", f"{name}_hi", f"rank_{name}"} <= set(table.columns)
        assert sorted(table[f"rank_{name}"]) == [1, 2, 3]
    assert (table.grad_norm_lo <= table.grad_norm).all() and (table.grad_norm <= table.grad_norm_hi).all()
    best = table.sort_values("rank_d_align").layer.tolist()
    assert [f"model.layers.{i}" for i in map(int, orders["d_align"])] == best
    assert table.redundancy.between(0, 0.9).all() and "warning:" not in err
    assert main(["rank", "--model", str(folder), "--data", str(data), "--examples", "16", "--seq-len", "12",
                 "--budgets", "9"]) == 1
    assert "--budgets" in capsys.readouterr().err


def test_rank_shows_ties_as_ties_and_names_the_points_it_cannot_separate():
    from dalign_core.cli.rank import format_ranking

    def row(i, d, g):
        return dict(layer=f"l{i}", d_align=d, d_align_lo=d - 0.01, d_align_hi=d + 0.01, grad_norm=g,
                    grad_norm_lo=g, grad_norm_hi=g, mean_sq=1.0, mean_sq_lo=float("nan"), mean_sq_hi=float("nan"),
                    alignment_4=1.0, alignment_4_lo=0.0, alignment_4_hi=2.0, b_align_4=-d)
    rows = [row(0, 0.03, 2.0), row(1, 0.025, 2.0), row(2, 0.001, 1.0)]
    names = ["d_align", "mean_sq", "alignment_4", "b_align_4", "grad_norm"]
    for name in names:  # ranks as growth.point_rows gives them (ties: the given order)
        for k, r in enumerate(sorted(rows, key=lambda r: -r[name] if name != "b_align_4" else r[name])):
            r[f"rank_{name}"] = k + 1
    text = format_ranking(rows, names, {}, 16, "shared", 0.95, evidence="growth: inconclusive (a reason).")
    assert "recommended by d_align: #0 (l0); the d_align intervals of #1 overlap it" in " ".join(text.split())
    orders = _rank_lines(text)
    assert "|grad|      0 = 1 > 2" in text and "||mu||^2    0 = 1 = 2" in text
    assert "same order as d_align: B_align@4" in text and orders["B_align@4"] == ["0", "1", "2"]
    assert text.rstrip().endswith("growth: inconclusive (a reason).")


def test_rank_warns_where_q_is_a_trained_bias_gradient(pythia_checkpoint, checkpoint, capsys):
    _, data = checkpoint
    assert main(["rank", "--model", str(pythia_checkpoint), "--data", str(data), "--examples", "16",
                 "--seq-len", "12", "--batch-size", "8", "--redundancy-examples", "16"]) == 0
    printed, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and all("dense_4h_to_h.bias" in w for w in warnings)
    assert printed.count("*") >= 2


def test_rank_takes_a_torchvision_resnet(tmp_path, capsys):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).eval()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    images = torch.randn(16, 3, 16, 16)
    torch.save({"inputs": images, "targets": torch.randint(0, 5, (16,))}, tmp_path / "images.pt")
    out = tmp_path / "resnet.csv"
    base = ["rank", "--arch", "torchvision.models:resnet18", "--model", str(tmp_path / "weights.pt"),
            "--data", str(tmp_path / "images.pt"), "--examples", "16", "--batch-size", "8", "--device", "cpu",
            "--redundancy-examples", "8"]
    assert main(base + ["--arch-kwargs", '{"num_classes": 5}', "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines() if not line.startswith("wrote ")), printed  # not the path
    table = pd.read_csv(out)
    assert list(table.layer) == [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)]
    assert sorted(table.rank_grad_norm) == list(range(1, 9))
    assert all(len(order) == 8 for order in _rank_lines(printed).values())
    # a state dict that does not fit what --arch builds is refused with one line
    assert main(base) == 1
    err = capsys.readouterr().err
    assert "does not match" in err and "--arch-kwargs" in err


# ---------------------------------------------------------------------------
# estimate and layers take --arch as rank does: tensor files and image folders


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    """A torchvision ResNet-18 of 3 classes (its state dict), a tensor file and an ImageFolder of 12 small images."""
    torchvision = pytest.importorskip("torchvision")
    from PIL import Image

    root = tmp_path_factory.mktemp("vision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).eval()
    torch.save(model.state_dict(), root / "weights.pt")
    torch.save({"inputs": torch.randn(12, 3, 32, 32), "targets": torch.randint(0, 3, (12,))}, root / "images.pt")
    generator = torch.Generator().manual_seed(1)
    for label in ("cat", "dog", "fox"):
        (root / "folder" / label).mkdir(parents=True)
        for i in range(4):
            pixels = (torch.rand(40, 48, 3, generator=generator) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(root / "folder" / label / f"{i}.png")
    return root


def _vision_argv(vision, command: str, data: str, *extra: str) -> list[str]:
    return [command, "--arch", "torchvision.models:resnet18", "--arch-kwargs", '{"num_classes": 3}',
            "--model", str(vision / "weights.pt"), "--data", str(vision / data), "--device", "cpu", *extra]


@pytest.mark.parametrize("data", ["images.pt", "folder"])
def test_estimate_takes_an_arch_model_on_tensors_or_an_image_folder(vision, tmp_path, capsys, data):
    out = tmp_path / "geometry.csv"
    extra = ["--image-size", "32"] if data == "folder" else []
    assert main(_vision_argv(vision, "estimate", data, "--layer", "all", "--examples", "12", "--batch-size", "6",
                             "--redundancy-examples", "8", "--quiet", "--out", str(out), *extra)) == 0
    printed, err = capsys.readouterr()
    assert "ranked by d_align" in printed
    table = pd.read_csv(out)
    assert sorted(table.layer) == sorted(f"layer{s}.{b}" for s in range(1, 5) for b in range(2))
    assert (table.n == 12).all() and table.redundancy.notna().all()
    if data == "folder":  # the transform is stated, so the numbers can be redone
        assert "12 of 12" in err and "3 classes: cat, dog, fox" in err and "Resize(32) -> CenterCrop(32)" in err
        assert "Normalize(mean=(0.485, 0.456, 0.406)" in err


def test_layers_takes_an_arch_model(vision, capsys):
    assert main(["layers", "--arch", "torchvision.models:resnet18", "--arch-kwargs", '{"num_classes": 3}',
                 "--model", str(vision / "weights.pt")]) == 0
    assert capsys.readouterr().out.split() == [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)]
    assert main(_vision_argv(vision, "layers", "folder", "--image-size", "32", "--redundancy-examples", "8")) == 0
    printed = capsys.readouterr().out
    assert "redundancy of q at each block on n=8 examples" in printed and "layer4.1" in printed


def test_rank_takes_an_image_folder(vision, capsys):
    assert main(_vision_argv(vision, "rank", "folder", "--image-size", "32", "--examples", "12", "--batch-size", "6",
                             "--redundancy-examples", "0")) == 0
    assert "insertion points" in capsys.readouterr().out


def test_an_arch_estimate_never_writes_over_its_inputs(vision, tmp_path, capsys):
    import shutil

    copy = tmp_path / "w.csv"
    shutil.copy(vision / "weights.pt", copy)
    argv = _vision_argv(vision, "estimate", "images.pt", "--layer", "layer1.0", "--examples", "12", "--out", str(copy))
    argv[argv.index(str(vision / "weights.pt"))] = str(copy)
    saved = copy.read_bytes()
    assert main(argv) == 1
    assert "the --model file" in capsys.readouterr().err and copy.read_bytes() == saved
