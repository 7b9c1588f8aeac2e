"""The Pythia family on the shared sweep: depth regimes, matched relative insertion depth, Pythia's initialization."""

import pandas as pd
import pytest
import torch

from dalign_repro.experiments import pythia_width
from dalign_repro.models.pythia import build_pythia, pythia_width_variant
from test_llama_width import tiny_corpus  # tests/ is on sys.path (rootdir-less test modules)


def test_regimes_are_separate_sweeps_at_matched_relative_depth():
    config = pythia_width.Config.for_profile("cpu")
    first, deep = config.sweeps()
    assert (first.depth, first.widths, first.heads) == (6, (32, 64, 128), (4, 8, 8))
    assert (deep.depth, deep.widths, deep.heads) == (12, (32, 48, 64), (2, 3, 4))
    assert first.deep_depth is None and deep.deep_depth is None
    # half-way through either stack: layer 2 of 0..5 and layer 5 of 0..11
    family = pythia_width.FAMILY
    assert family.primary_layer(first) == "gpt_neox.layers.2" and family.primary_layer(deep) == "gpt_neox.layers.5"
    assert family.columns(deep) == {"depth": 12}
    assert first.config_hash() != deep.config_hash()  # each regime keeps its own finished jobs
    with pytest.raises(ValueError, match="one entry per width"):
        pythia_width.Config.for_profile("cpu", heads=(4, 8))


def test_pythia_init_follows_small_init_and_wang_init():
    shape = pythia_width_variant("pythia-70m", 64, vocab_size=256, num_heads=4, num_layers=6, context=32)
    model = build_pythia(shape, seed=0)
    small, wang = (2 / (5 * 64)) ** 0.5, 2 / (6 * 64 ** 0.5)
    weights = dict(model.named_parameters())
    assert weights["gpt_neox.embed_in.weight"].std().item() == pytest.approx(small, rel=0.05)
    assert weights["gpt_neox.layers.3.mlp.dense_h_to_4h.weight"].std().item() == pytest.approx(small, rel=0.05)
    assert weights["gpt_neox.layers.3.mlp.dense_4h_to_h.weight"].std().item() == pytest.approx(wang, rel=0.05)
    assert weights["gpt_neox.layers.3.attention.dense.weight"].std().item() == pytest.approx(wang, rel=0.1)
    assert torch.all(weights["gpt_neox.layers.3.input_layernorm.weight"] == 1)
    assert torch.all(weights["gpt_neox.layers.3.attention.query_key_value.bias"] == 0)
    same = build_pythia(shape, seed=0).state_dict()
    assert all(torch.equal(v, same[k]) for k, v in model.state_dict().items())


def test_smoke_sweep_writes_both_regimes_with_a_depth_column(tmp_path, monkeypatch):
    monkeypatch.setattr("dalign_repro.families.lm.load_corpus", lambda name: tiny_corpus())
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DALIGN_CACHE", str(tmp_path / "cache"))
    config = pythia_width.Config.for_profile("smoke", vocab_size=300, steps=6, warmup_steps=1,
                                             checkpoint_steps=(0, 4, 6), lr_candidates=(1e-2,), resamples=200)
    out = pythia_width.run(config, out_dir=tmp_path / "results")
    runs = pd.read_csv(out / "pythia_runs.csv")
    geometry = pd.read_csv(out / "pythia_geometry.csv")
    misalignment = pd.read_csv(out / "pythia_misalignment.csv")
    assert sorted(runs.depth.unique()) == [2, 3] and len(runs) == 2 * 3 * config.seeds
    assert set(geometry[geometry.depth == 3].layer) == {f"gpt_neox.layers.{i}" for i in range(3)}
    assert set(misalignment[misalignment.depth == 2].layer) == {"gpt_neox.layers.0"}
    assert set(misalignment[misalignment.depth == 3].layer) == {"gpt_neox.layers.1"}
    shared, full = geometry[geometry.reduction == "shared"], geometry[geometry.reduction == "full"]
    assert (shared.d == shared.width).all()  # shared reduction: q has the model's width
    assert (full.d == full.width * config.context).all() and len(full) == len(shared)  # full: every position
    redundancy = pd.read_csv(out / "pythia_redundancy.csv")
    # the literal q is the trained output bias's gradient; the judged, per-position one is not
    assert (redundancy[redundancy.reduction == "shared"].exact.str.endswith("dense_4h_to_h.bias")
            | redundancy[redundancy.reduction == "shared"].exact.str.endswith("attention.dense.bias")).all()
    assert (redundancy[redundancy.reduction == "full"].fraction < 0.5).all()
    assert not (out / "partial").exists() or not any((out / "partial").iterdir())
