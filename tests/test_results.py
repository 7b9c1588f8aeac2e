"""Results files: atomic writes, provenance, config hashing and skip-if-current."""

import dataclasses
import json
import os

import pandas as pd
import pytest

from dalign_core import results
from dalign_core.experiments import theory


def test_config_for_profile_and_hash():
    smoke = theory.Config.for_profile("smoke")
    assert smoke.profile == "smoke" and smoke.trials == 2_000
    assert smoke.config_hash() == theory.Config.for_profile("smoke").config_hash()
    assert smoke.config_hash() != theory.Config.for_profile("smoke", seed=1).config_hash()
    with pytest.raises(ValueError, match="unknown profile 'gpu'; choose one of smoke, cpu, paper"):
        theory.Config.for_profile("gpu")
    with pytest.raises(TypeError, match="has no field"):
        theory.Config.for_profile("cpu", trails=5)


def test_write_table_is_atomic_and_records_provenance(tmp_path, monkeypatch):
    config = theory.Config.for_profile("smoke")
    table = pd.DataFrame({"a": [1, 2], "b": [0.5, 0.25]})
    path = results.write_table(table, tmp_path, "example", config, wall_time_s=1.23456)
    assert path == tmp_path / "example.csv"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["example.csv", "example.json"]  # no temporaries left
    record = json.loads((tmp_path / "example.json").read_text())
    assert record["config_hash"] == config.config_hash()
    assert record["config"]["trials"] == config.trials and record["seed"] == config.seed
    assert {"commit", "dirty"} <= set(record["git"]) and "torch" in record["versions"]
    assert record["hardware"]["cpu_count"] == os.cpu_count() and record["wall_time_s"] == 1.235
    read_back, provenance = results.read_table(tmp_path, "example")
    pd.testing.assert_frame_equal(read_back, table)
    assert results.results_current(tmp_path, ["example"], config)
    assert not results.results_current(tmp_path, ["example"], dataclasses.replace(config, seed=9))

    # A failure while writing leaves the old file in place and no temporary behind.
    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(results.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        results.atomic_write_text(tmp_path / "example.csv", "half")
    assert (tmp_path / "example.csv").read_text() == table.to_csv(index=False)
    assert not list(tmp_path.glob("*.tmp"))


def test_read_table_says_how_to_make_missing_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the experiment that writes it first"):
        results.read_table(tmp_path / "cpu", "nothing")


def test_theory_smoke_is_deterministic_and_skips_when_current(tmp_path, capsys):
    config = theory.Config.for_profile("smoke")
    first = theory.run(config, out_dir=tmp_path / "a")
    second = theory.run(config, out_dir=tmp_path / "b")
    for name in theory.TABLES:
        pd.testing.assert_frame_equal(pd.read_csv(first / f"{name}.csv"), pd.read_csv(second / f"{name}.csv"))
    capsys.readouterr()
    theory.run(config, out_dir=tmp_path / "a")
    assert "skipping" in capsys.readouterr().out
    alignment = pd.read_csv(first / "theory_alignment.csv")
    assert (alignment.b_exact <= alignment.b_align + 1e-12).all()


def test_theory_command_line(tmp_path):
    from dalign_core.experiments._cli import run_cli

    run_cli(theory.Config, theory.run, "theory", ["--profile", "smoke", "--seed", "3", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "theory_alignment.json").read_text())
    assert record["seed"] == 3 and record["profile"] == "smoke"
