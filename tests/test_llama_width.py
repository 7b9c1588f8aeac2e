"""The LLaMA width experiment end to end on a tiny corpus made here (no download)."""

import random

import pandas as pd
import pytest

from dalign_core.data.text import TextCorpus
from dalign_core.experiments import llama_width

GEOMETRY_COLUMNS = {
    "family", "model", "width", "depth", "seed", "layer", "n", "mean_sq", "directional", "cov_energy",
    "d_par", "d_2", "d_align", "d_align_lo", "d_align_hi", "heldout_loss", "baseline_loss",
}
MISALIGNMENT_COLUMNS = {
    "family", "model", "width", "seed", "layer", "M", "K", "trials", "p_misalign", "p_misalign_se", "b_exact", "b_align",
}


def tiny_corpus() -> TextCorpus:
    rng = random.Random(0)
    words = "the king and queen of verona speak to a lord who loves her well but fears the night".split()
    docs = [" ".join(rng.choice(words) for _ in range(3000)) + "." for _ in range(6)]
    return TextCorpus(tuple(docs[:5]), tuple(docs[5:]), tuple(f"w{i}" for i in range(5)), ("w5",), source="test")


@pytest.fixture
def tiny_run(tmp_path, monkeypatch):
    monkeypatch.setattr(llama_width, "load_corpus", lambda name: tiny_corpus())
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DALIGN_CACHE", str(tmp_path / "cache"))
    config = llama_width.Config.for_profile(
        "smoke", widths=(32,), vocab_size=300, steps=6, checkpoint_steps=(0, 6), resamples=500, eval_sequences=16,
    )
    out = llama_width.run(config, out_dir=tmp_path / "results")
    return config, out


def test_tables_have_the_documented_columns(tiny_run):
    config, out = tiny_run
    geometry = pd.read_csv(out / "llama_geometry.csv")
    misalignment = pd.read_csv(out / "llama_misalignment.csv")
    units = pd.read_csv(out / "llama_sample_unit.csv")
    assert GEOMETRY_COLUMNS <= set(geometry.columns)
    assert MISALIGNMENT_COLUMNS <= set(misalignment.columns)
    # One row per (step, pool, layer) for the single (width, seed).
    assert len(geometry) == 2 * 2 * config.depth
    assert set(geometry.step) == {0, 6} and set(geometry.pool) == {"train", "heldout"}
    assert (geometry.n == config.pool_size).all() and (geometry.d == 32).all()
    assert set(misalignment.setting) == {"heldout/heldout", "train/heldout"}
    assert len(misalignment) == 2 * len(config.budgets)
    assert (misalignment.b_exact <= misalignment.b_align + 1e-12).all()
    assert set(units.unit) == {"sequence", "token"} and set(units.context) == set(config.unit_contexts)
    assert (units[units.reduction == "full"].d == units[units.reduction == "full"].context * 32).all()
    # A six-step model cannot beat the bigram baseline: it must be marked as a failed run.
    assert not geometry.trained_ok.any()


def test_rerun_skips_and_is_deterministic(tiny_run, tmp_path, capsys):
    config, out = tiny_run
    first = pd.read_csv(out / "llama_geometry.csv")
    capsys.readouterr()
    llama_width.run(config, out_dir=out)
    assert "skipping" in capsys.readouterr().out
    # Forcing a rerun resumes the finished training from its checkpoints and measures again.
    llama_width.run(config, out_dir=out, force=True)
    pd.testing.assert_frame_equal(pd.read_csv(out / "llama_geometry.csv"), first)


def test_checkpoints_are_keyed_by_what_determines_the_weights():
    config = llama_width.Config.for_profile("smoke")
    root = llama_width.checkpoint_root(config)
    assert llama_width.checkpoint_root(llama_width.Config.for_profile("smoke", resamples=7, pool_size=9)) == root
    assert llama_width.checkpoint_root(llama_width.Config.for_profile("smoke", lr=1e-4)) != root
    assert llama_width.checkpoint_root(llama_width.Config.for_profile("cpu")).parent.parent.name == "cpu"


def test_describe_runs_reports_failures_and_loss_trend():
    runs = pd.DataFrame(dict(width=[32, 64, 64], seed=[0, 0, 1], heldout_loss=[4.3, 4.1, 9.0],
                             trained_ok=[True, True, False]))
    text = llama_width.describe_runs(runs)
    assert text.startswith("**1 of 3 runs failed**") and "N=64 seed 1" in text
    assert "N=32: 4.300, N=64: 4.100" in text and "falls with every increase" in text


def test_a_diverged_run_is_reported_as_failed(tmp_path, monkeypatch):
    def diverge(*args, **kwargs):
        raise FloatingPointError("loss is nan at step 3; lower the learning rate")

    monkeypatch.setattr(llama_width, "load_corpus", lambda name: tiny_corpus())
    monkeypatch.setattr(llama_width, "train", diverge)
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DALIGN_CACHE", str(tmp_path / "cache"))
    config = llama_width.Config.for_profile("smoke", widths=(32,), vocab_size=300, eval_sequences=16)
    out = llama_width.run(config, out_dir=tmp_path / "results")
    from dalign_core.results import read_table

    geometry, provenance = read_table(out, "llama_geometry")
    assert geometry.empty and llama_width.trained_only(geometry).empty
    runs = llama_width.run_summary(provenance)
    assert not runs.trained_ok.any() and "failure" in provenance["runs"][0]
    assert "1 of 1 runs failed" in llama_width.describe_runs(runs)


def test_same_seed_and_profile_give_the_same_numbers(tmp_path, monkeypatch):
    """Two independent runs (separate checkpoints, caches and results) agree exactly on the CPU."""
    monkeypatch.setattr(llama_width, "load_corpus", lambda name: tiny_corpus())
    config = llama_width.Config.for_profile(
        "smoke", widths=(32,), vocab_size=300, steps=4, checkpoint_steps=(0, 4), resamples=300, eval_sequences=16,
    )
    tables = []
    for attempt in ("first", "second"):
        monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / attempt / "checkpoints"))
        monkeypatch.setenv("DALIGN_CACHE", str(tmp_path / attempt / "cache"))
        out = llama_width.run(config, out_dir=tmp_path / attempt / "results")
        tables.append([pd.read_csv(out / f"{name}.csv") for name in llama_width.TABLES])
    for first, second in zip(*tables):
        pd.testing.assert_frame_equal(first, second)
