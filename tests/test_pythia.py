"""Pythia architectures and width variants, revision folders, and the released-checkpoint experiment, offline."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml

from dalign_core.cli.app import main
from dalign_repro.config import REPO_ROOT
from dalign_repro.data.text import TextCorpus
from dalign_repro.experiments import pythia_checkpoints as pc
from dalign_core.cli.loading import LoadError, load_model, load_tokenizer, resolve_model_source
from dalign_repro.models.pythia import (PUBLISHED_PARAMETERS, PYTHIA_NAMES, build_pythia, count_parameters, head_dim,
                                       pythia_config, pythia_width_variant)

transformers = pytest.importorskip("transformers")

ARCH = {  # name: width, layers, heads (the suite's model cards)
    "pythia-14m": (128, 6, 4), "pythia-31m": (256, 6, 8), "pythia-70m": (512, 6, 8),
    "pythia-160m": (768, 12, 12), "pythia-2.8b": (2560, 32, 32), "pythia-6.9b": (4096, 32, 32),
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def tiny_corpus() -> TextCorpus:
    """Nine documents of made-up words (no download): 5 train, 2 validation, 2 test."""
    rng = random.Random(0)
    syllables = "ka lo mi ren tu sa vor el na qui dro fen ba zu".split()
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(120)]
    docs = [" ".join(rng.choice(words) for _ in range(3000)) + "." for _ in range(9)]
    names = [f"w{i}" for i in range(9)]
    return TextCorpus(tuple(docs[:5]), tuple(docs[7:]), tuple(names[:5]), tuple(names[7:]), source="test",
                      validation_texts=tuple(docs[5:7]), validation_names=tuple(names[5:7]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``<root>/pythia-tiny/{step0,step1000}/``: a 2-layer, width-32 GPT-NeoX with a BPE of the tiny corpus."""
    root = tmp_path_factory.mktemp("pythia_models")
    pc.make_tiny_checkpoints(root / "pythia-tiny", ("step0", "step1000"), corpus=tiny_corpus(),
                             cache_dir=root / "cache")
    return root


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    path = tmp_path_factory.mktemp("pythia_text") / "held_out.txt"
    path.write_text("\n\n".join(tiny_corpus().test_texts), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------
# Architectures


@pytest.mark.parametrize("name", PYTHIA_NAMES)
def test_released_architectures_match_the_published_parameter_counts(name):
    config = pythia_config(name)
    width, layers, heads = ARCH[name]
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (width, layers, heads)
    assert config.intermediate_size == 4 * width
    assert config.vocab_size == (50432 if name == "pythia-6.9b" else 50304)
    assert config.rope_parameters["partial_rotary_factor"] == 0.25 and config.rope_parameters["rope_theta"] == 10000
    assert config.use_parallel_residual and not config.tie_word_embeddings and config.attention_bias
    assert config.layer_norm_eps == 1e-5 and config.max_position_embeddings == 2048 and config.hidden_act == "gelu"
    assert count_parameters(config) == PUBLISHED_PARAMETERS[name]


def test_width_variant_keeps_the_head_dimension_and_everything_else():
    config = pythia_width_variant("pythia-70m", 256, vocab_size=2048, context=128, num_layers=3)
    assert (config.hidden_size, config.num_attention_heads, head_dim(config)) == (256, 4, 64)
    assert config.intermediate_size == 1024 and config.vocab_size == 2048
    assert config.max_position_embeddings == 128 and config.num_hidden_layers == 3
    assert config.use_parallel_residual and not config.tie_word_embeddings
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    # defaults: the named model's depth and context; num_heads overrides the head dimension
    same = pythia_width_variant("pythia-14m", 64, vocab_size=300)
    assert (same.num_attention_heads, same.num_hidden_layers, same.max_position_embeddings) == (2, 6, 2048)
    assert pythia_width_variant("pythia-14m", 64, vocab_size=300, num_heads=4).num_attention_heads == 4
    # embeddings and LM head are untied: 2 * V * N of the total
    small = pythia_width_variant("pythia-14m", 32, vocab_size=100, num_layers=1)
    per_layer = 4 * 32 + (3 * 32 * 32 + 3 * 32) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32)
    assert count_parameters(small) == 2 * 100 * 32 + per_layer + 2 * 32


def test_width_variant_errors_say_what_to_use():
    with pytest.raises(ValueError, match=r"not a multiple of pythia-14m's head dimension 32.*num_heads"):
        pythia_width_variant("pythia-14m", 48, vocab_size=300)
    with pytest.raises(ValueError, match="not divisible by num_heads=5"):
        pythia_width_variant("pythia-14m", 64, vocab_size=300, num_heads=5)
    with pytest.raises(ValueError, match=r"1 rotary dimensions.*even number >= 2: use num_heads in \[1, 2, 4\]"):
        pythia_width_variant("pythia-14m", 32, vocab_size=300, num_heads=8)  # head dim 4: int(4 / 4) = 1
    with pytest.raises(ValueError, match="unknown Pythia model"):
        pythia_config("pythia-1m")


def test_build_is_deterministic_dropout_free_and_round_trips(tmp_path):
    config = pythia_width_variant("pythia-14m", 32, vocab_size=97, num_layers=2, context=64)
    state = torch.get_rng_state()
    a, b, c = build_pythia(config, 0), build_pythia(config, 0), build_pythia(config, 1)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left as it was
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.gpt_neox.embed_in.weight, c.gpt_neox.embed_in.weight)
    assert a.config._attn_implementation == "sdpa" and a.config.attention_dropout == a.config.hidden_dropout == 0
    assert a.gpt_neox.layers[0].attention.rotary_ndims == 8  # 25% of head dimension 32
    a.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 97, (2, 12))
    torch.testing.assert_close(loaded(input_ids=ids).logits, a.eval()(input_ids=ids).logits)


# ---------------------------------------------------------------------------
# Revisions


def test_revision_folders_load_through_the_same_loader(tiny):
    folder = tiny / "pythia-tiny"
    sources = {r: resolve_model_source(str(folder), revision=r) for r in ("step0", "step1000")}
    assert sources["step1000"].path == str(folder / "step1000") and sources["step1000"].local
    models = {r: load_model(s) for r, s in sources.items()}
    assert isinstance(models["step0"], transformers.GPTNeoXForCausalLM) and not models["step0"].training
    assert models["step0"].config.hidden_size == 32 and models["step0"].config.num_hidden_layers == 2
    heads = [m.get_output_embeddings().weight for m in models.values()]
    assert not torch.equal(*heads)
    tokenizer = load_tokenizer(str(folder), revision="step0")
    assert len(tokenizer) == models["step0"].config.vocab_size
    # a revision folder without tokenizer files uses its parent's
    bare = tiny / "shared-tokenizer"
    (bare / "step0").mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (bare / "step0" / name).write_bytes((folder / "step0" / name).read_bytes())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).write_bytes((folder / "step0" / name).read_bytes())
    assert len(load_tokenizer(resolve_model_source(str(bare), revision="step0"))) == len(tokenizer)


def test_revision_errors_list_what_is_there(tiny):
    folder = tiny / "pythia-tiny"
    with pytest.raises(LoadError, match=r"no revision folder 'step8000'; revisions present: step0, step1000"):
        resolve_model_source(str(folder), revision="step8000")
    with pytest.raises(LoadError, match=r"one checkpoint per revision \(step0, step1000\); choose one with --revision"):
        resolve_model_source(str(folder))
    with pytest.raises(LoadError, match="single checkpoint: drop --revision"):
        resolve_model_source(str(folder / "step0"), revision="step0")


def test_uncached_hub_revision_offline_fails_at_once_with_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(LoadError) as info:
        resolve_model_source("EleutherAI/pythia-70m", revision="step1000")
    message = str(info.value)
    assert "at revision 'step1000'" in message and "HF_HUB_OFFLINE is set" in message
    assert "hf download EleutherAI/pythia-70m --revision step1000 --local-dir ./pythia-70m/step1000" in message
    assert "--model ./pythia-70m --revision step1000" in message


def test_cli_estimate_and_layers_take_a_revision(tiny, held_out, tmp_path, capsys):
    folder = tiny / "pythia-tiny"
    data = held_out
    out = tmp_path / "est.csv"
    assert main(["estimate", "--model", str(folder), "--revision", "step1000", "--layer", "all", "--data", str(data),
                 "--examples", "8", "--seq-len", "16", "--batch-size", "4", "--out", str(out), "--quiet"]) == 0
    table = pd.read_csv(out)
    assert sorted(table["layer"]) == ["gpt_neox.layers.0", "gpt_neox.layers.1"]
    assert (table["revision"] == "step1000").all() and (table["d"] == 32).all()
    capsys.readouterr()
    assert main(["layers", "--model", str(folder), "--revision", "step0"]) == 0
    assert capsys.readouterr().out.split() == ["gpt_neox.layers.0", "gpt_neox.layers.1"]
    assert main(["layers", "--model", str(folder), "--revision", "step5"]) == 1
    assert "revisions present: step0, step1000" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# The experiment


def test_layer_fractions_match_relative_depth():
    assert [pc.layer_index(f, 6) for f in (0.25, 0.5, 0.75, 1.0)] == [1, 2, 4, 5]
    assert [pc.layer_index(f, 32) for f in (0.25, 0.5, 0.75, 1.0)] == [7, 15, 23, 31]
    assert pc.layer_index(0.01, 6) == 0 and pc.step_of("step143000") == 143000 and pc.step_of("main") is None


def test_smoke_profile_writes_the_table(tiny, held_out, results_root):
    config = pc.Config.for_profile("smoke", models_dir=str(tiny), text=str(held_out))
    out = pc.run(config)
    table = pd.read_csv(out / "pythia_released.csv")
    assert list(table.columns) == pc.COLUMNS
    assert len(table) == 4 and set(table["revision"]) == {"step0", "step1000"}
    assert set(table["step"]) == {0, 1000} and set(table["layer"]) == {"gpt_neox.layers.0", "gpt_neox.layers.1"}
    assert set(table["relative_depth"]) == {0.5, 1.0} and (table["width"] == 32).all() and (table["depth"] == 2).all()
    assert (table["n"] == 16).all() and (table["d"] == 32).all()
    assert (table["d_align_lo"] <= table["d_align"] + 1e-9).all()
    assert (table["d_align"] <= table["d_align_hi"] + 1e-9).all()
    loss = table.groupby("revision")["heldout_loss"].first()
    vocab = json.loads((tiny / "pythia-tiny" / "step0" / "config.json").read_text())["vocab_size"]
    # near uniform at initialization (Pythia's small_init gives logits of std about 0.5 at width 32)
    assert loss["step0"] == pytest.approx(math.log(vocab), abs=0.5)
    assert loss["step1000"] < loss["step0"] - 1.0
    provenance = json.loads((out / "pythia_released.json").read_text())
    assert set(provenance["checkpoints"]) == {"pythia-tiny@step0", "pythia-tiny@step1000"}
    assert provenance["text"] == f"file:{held_out.resolve()}"
    assert pc.run(config) == out  # current: reused


def test_evaluation_pool_is_whole_windows_of_the_test_documents(tiny, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    corpus = tiny_corpus()
    for name, text in zip(corpus.names, corpus.train_texts + corpus.validation_texts + corpus.test_texts):
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
    documents, source = pc.evaluation_documents(f"dir:{folder}")
    assert documents == [corpus.train_texts[0]] and source.startswith("dir:")  # of w0..w8 the rule makes w0 test
    tokenizer = load_tokenizer(str(tiny / "pythia-tiny"), revision="step0")
    config = pc.Config.for_profile("smoke", examples=20, seq_len=24)
    pool, available = pc.evaluation_windows(tokenizer, documents, config)
    assert pool.shape == (20, 24) and available >= 20
    assert torch.equal(pool, pc.evaluation_windows(tokenizer, documents, config)[0])  # seeded
    ids = tokenizer(documents[0], add_special_tokens=False)["input_ids"]
    starts = {tuple(ids[i:i + 24]) for i in range(0, len(ids) - 23, 24)}
    assert all(tuple(row.tolist()) in starts for row in pool)
    with pytest.raises(ValueError, match="examples=100000"):
        pc.evaluation_windows(tokenizer, documents, pc.Config.for_profile("smoke", examples=100_000, seq_len=24))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pc.evaluation_documents(str(tmp_path / "none.txt"))


def test_hub_profiles_fail_at_once_offline_with_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(LoadError) as info:
        pc.resolve_checkpoints(pc.Config.for_profile("gpu"))
    message = str(info.value)
    assert "15 Pythia checkpoint(s)" in message and "HF_HUB_OFFLINE is set" in message
    for name in pc.SMALL:
        for revision in pc.REVISIONS:
            assert f"hf download EleutherAI/{name} --revision {revision}\n" in message + "\n"


def test_command_line_offline_error_has_no_traceback(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(REPO_ROOT),
           "DALIGN_RESULTS": str(tmp_path / "results")}
    proc = subprocess.run([sys.executable, "-m", "dalign_repro.experiments.pythia_checkpoints", "--profile", "gpu"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1
    assert "hf download EleutherAI/pythia-70m --revision step143000" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_manifest_agrees_with_the_code():
    manifest = yaml.safe_load((REPO_ROOT / "data_manifests" / "pythia_revisions.yaml").read_text())
    assert tuple(manifest["revisions"]) == pc.REVISIONS and manifest["final"] == pc.REVISIONS[-1]
    for name, entry in manifest["models"].items():
        config = pythia_config(name)
        assert entry["id"] == f"{pc.HUB_ORG}/{name}"
        assert (entry["width"], entry["layers"], entry["heads"]) == ARCH[name]
        assert entry["parameters"] == PUBLISHED_PARAMETERS[name] == count_parameters(config)
    for profile, names in manifest["profiles"].items():
        config = pc.Config.for_profile(profile)
        assert list(config.names) == names and config.revisions == pc.REVISIONS and config.models_dir is None
