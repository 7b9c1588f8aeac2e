"""The LLaMA family end to end on a tiny corpus made here (no download), and its sample-unit study."""

import json
import logging
import random

import pandas as pd
import pytest
import torch

from dalign_repro.sweep.pools import check_supply
from dalign_repro.sweep.trained import checkpoint_root
from dalign_repro.data.text import TextCorpus
from dalign_repro.experiments import llama_width
from dalign_repro.families.llama import token_targets
from dalign_repro.models.llama import build_llama

GEOMETRY_COLUMNS = {
    "family", "model", "width", "seed", "lr", "step", "pool", "layer", "n", "mean_sq", "directional", "cov_energy",
    "d_par", "d_2", "d_align", "d_align_lo", "d_align_hi", "heldout_loss", "baseline_loss", "trained_ok",
}
MISALIGNMENT_COLUMNS = {
    "family", "model", "width", "seed", "layer", "setting", "M", "K", "trials", "p_misalign", "p_misalign_lo",
    "p_misalign_hi", "b_exact", "b_align", "b_align_at_lo", "bound_note",
}


def tiny_corpus() -> TextCorpus:
    rng = random.Random(0)
    words = "the king and queen of verona speak to a lord who loves her well but fears the night".split()
    docs = [" ".join(rng.choice(words) for _ in range(4000)) + "." for _ in range(9)]
    names = [f"w{i}" for i in range(9)]
    return TextCorpus(tuple(docs[:5]), tuple(docs[7:]), tuple(names[:5]), tuple(names[7:]), source="test",
                      validation_texts=tuple(docs[5:7]), validation_names=tuple(names[5:7]))


def tiny_config(**overrides):
    values = dict(widths=(16, 32, 48), vocab_size=300, steps=6, warmup_steps=1, checkpoint_steps=(0, 4, 6),
                  resamples=300)
    return llama_width.Config.for_profile("smoke", **{**values, **overrides})


@pytest.fixture
def tiny_env(tmp_path, monkeypatch):
    monkeypatch.setattr("dalign_repro.families.lm.load_corpus", lambda name: tiny_corpus())
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DALIGN_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture
def tiny_run(tiny_env):
    config = tiny_config()
    return config, llama_width.run(config, out_dir=tiny_env / "results")


def test_tables_have_the_documented_columns(tiny_run):
    config, out = tiny_run
    geometry = pd.read_csv(out / "llama_geometry.csv")
    misalignment = pd.read_csv(out / "llama_misalignment.csv")
    units = pd.read_csv(out / "llama_sample_unit.csv")
    assert GEOMETRY_COLUMNS <= set(geometry.columns)
    assert MISALIGNMENT_COLUMNS <= set(misalignment.columns)
    assert set(geometry.layer) == {"model.layers.0", "model.layers.1"}
    # the checkpoints before the last capture a block of checkpoint_pool_size examples, the last the whole pool
    final = geometry.step == config.steps
    assert (geometry.n[final] == config.pool_size).all() and (geometry.n[~final] == config.checkpoint_pool_size).all()
    assert set(units.unit) == {"sequence", "token"} and set(units.context) == set(config.unit_contexts)
    full = units[units.reduction == "full"]
    assert (full.d == full.context * full.width).all()
    assert (units.n == config.pool_size).all()
    # A six-step model cannot beat the bigram baseline: every run is marked as failed.
    assert not geometry.trained_ok.any() and not pd.read_csv(out / "llama_runs.csv").trained_ok.any()


def test_rerun_skips_and_force_measures_the_same_models_again(tiny_run, caplog):
    config, out = tiny_run
    first = pd.read_csv(out / "llama_geometry.csv")
    with caplog.at_level(logging.INFO, logger="dalign"):
        llama_width.run(config, out_dir=out)
    assert "reusing them" in caplog.text
    llama_width.run(config, out_dir=out, force=True)  # finished training is loaded from its checkpoints
    pd.testing.assert_frame_equal(pd.read_csv(out / "llama_geometry.csv"), first)


def test_checkpoints_are_keyed_by_what_determines_the_weights():
    config = llama_width.Config.for_profile("smoke")
    root = checkpoint_root(config, llama_width.FAMILY)
    measured_differently = llama_width.Config.for_profile("smoke", resamples=7, pool_size=9, lr_candidates=(1.0,))
    assert checkpoint_root(measured_differently, llama_width.FAMILY) == root
    assert checkpoint_root(llama_width.Config.for_profile("smoke", depth=3), llama_width.FAMILY) != root
    assert checkpoint_root(llama_width.Config.for_profile("cpu"), llama_width.FAMILY).parent.parent.name == "cpu"


def test_the_token_unit_is_each_tokens_own_loss():
    """q of the token unit equals the gradient of that one token's loss, found by a separate backward pass."""
    config = tiny_config(unit_contexts=(8,))
    model = build_llama(16, depth=2, head_dim=16, vocab_size=50, context=8, seed=0).eval()
    sequences = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(1))
    labels = token_targets(sequences, seed=0)
    assert ((labels != -100).sum(dim=1) == 1).all() and (labels[:, 0] == -100).all()
    from dalign_core.capture.hooks import activation_gradients

    q = activation_gradients(model, "model.layers.0", {"input_ids": sequences}, labels)
    for i in range(len(sequences)):
        position = int((labels[i] != -100).nonzero())
        captured = {}
        handle = model.model.layers[0].register_forward_hook(
            lambda module, args, output: captured.setdefault("z", output[0] if isinstance(output, tuple) else output))
        logits = model(input_ids=sequences[i:i + 1]).logits
        handle.remove()
        loss = torch.nn.functional.cross_entropy(logits[0, position - 1], sequences[i, position])
        (grad,) = torch.autograd.grad(loss, captured["z"])
        torch.testing.assert_close(q[i], grad[0].sum(dim=0), rtol=1e-4, atol=1e-6)
    assert config.unit_contexts == (8,)


@pytest.mark.parametrize("profile", ["smoke", "cpu", "gpu", "paper"])
def test_every_profile_is_a_valid_config(profile):
    config = llama_width.Config.for_profile(profile)
    assert config.steps in config.checkpoint_steps and config.last_third
    assert all(4 * (M + K) <= config.pool_size for M, K in config.budgets)


def test_a_bad_insertion_layer_is_refused():
    with pytest.raises(ValueError, match="insertion_layer 5 is not a layer of a depth-2 model"):
        llama_width.Config.for_profile("cpu", insertion_layer=5)


def _splits_of_size(config, train, validation, test):
    from dalign_repro.sweep.family import Splits

    def sequences(n):
        return torch.zeros(n, config.context, dtype=torch.int64)

    return Splits(sequences(train), sequences(validation), sequences(test), unit=f"sequences of {config.context}")


@pytest.mark.parametrize("profile", ["gpu", "paper"])
def test_the_large_profiles_pass_the_data_checks_only_with_a_corpus_that_suffices(profile):
    from dalign_repro.data.supply import DataSupplyError, RepeatedDataWarning

    config = llama_width.Config.for_profile(profile)
    enough = config.steps * config.batch_size  # one epoch of training text
    facts = check_supply(config, _splits_of_size(config, enough, 600, 1600))
    assert facts["epochs"] == pytest.approx(1.0)
    needed = config.pool_size + config.eval_examples
    with pytest.raises(DataSupplyError, match=rf"held-out split has {needed - 1} sequences of \d+ tokens; pool_size \+ "):
        check_supply(config, _splits_of_size(config, enough, 600, needed - 1))
    # Shakespeare at context 256: 897 held-out sequences, which the gpu profile is sized to and the paper's is not
    if profile == "paper":
        with pytest.raises(DataSupplyError, match=r"held-out split has 897 sequences of \d+ tokens; pool_size \+ "):
            check_supply(config, _splits_of_size(config, enough, 600, 897))
    else:
        check_supply(config, _splits_of_size(config, enough, 600, 897))
    with pytest.warns(RepeatedDataWarning):
        check_supply(config, _splits_of_size(config, enough // 5, 600, 1600))  # 5 epochs


def test_the_command_line_dry_run_prints_a_projection(tiny_env, capsys):
    from dalign_repro.experiments._runner import main

    main(llama_width.Config, llama_width.run, dry_run=llama_width.dry_run, argv=["--profile", "smoke", "--dry-run"])
    out = capsys.readouterr().out
    assert "dry run of llama at profile smoke" in out and "ms/step x 20 steps x 3" in out and "projected:" in out
    assert not (tiny_env / "results").exists() and not (tiny_env / "checkpoints").exists()


def test_a_single_width_trains_and_writes_its_tables_without_a_power_plan(tiny_env):
    """``--set widths=32`` at a profile with a run SD: the sweep trains and measures its one width; the power plan,
    which sizes a slope on log width, is empty (one width has no slope), not a division by zero."""
    from dalign_repro.sweep import trend

    config = tiny_config(widths=(32,), run_sd=0.43)
    assert config.power_plan() == {}
    with pytest.raises(ValueError, match="at least two distinct widths"):
        trend.design_se(0.43, (32,), 3)
    out = llama_width.run(config, out_dir=tiny_env / "results")
    runs = pd.read_csv(out / "llama_runs.csv")
    assert set(runs.width) == {32}
    assert set(pd.read_csv(out / "llama_geometry.csv").width) == {32}
    slopes = pd.read_csv(out / "llama_trend.csv")
    assert set(slopes.label) <= {"not run"}  # one width: no slope test gives a label
    assert json.loads((out / "llama_runs.json").read_text())["power_plan"] == {}
    assert tiny_config(widths=(32, 48), run_sd=0.43).power_plan()["se"] > 0  # two widths: sized as before
