"""Results files: profiles, config hashing, atomic writes, provenance and skip-if-current."""

import dataclasses
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from dalign_core import atomic
from dalign_repro import config
from dalign_repro.report import results
from dalign_repro.experiments import theory


def test_config_for_profile_and_hash():
    smoke = theory.Config.for_profile("smoke")
    assert smoke.profile == "smoke" and smoke.trials == 2_000
    assert smoke.config_hash() == theory.Config.for_profile("smoke").config_hash()
    assert smoke.config_hash() != theory.Config.for_profile("smoke", seed=1).config_hash()
    assert config.PROFILES == ("smoke", "lab", "cpu", "gpu", "paper") and config.check_profile("gpu") == "gpu"
    with pytest.raises(ValueError, match="unknown profile 'huge'; choose one of smoke, lab, cpu, gpu, paper"):
        theory.Config.for_profile("huge")
    with pytest.raises(TypeError, match="has no field"):
        theory.Config.for_profile("cpu", trails=5)


def test_default_results_dir_is_per_profile(tmp_path, monkeypatch):
    monkeypatch.delenv("DALIGN_RESULTS", raising=False)
    assert config.default_results_dir("gpu") == config.REPO_ROOT / "results" / "gpu"
    monkeypatch.setenv("DALIGN_RESULTS", str(tmp_path))
    assert config.default_results_dir("smoke") == tmp_path / "smoke"
    with pytest.raises(ValueError, match="unknown profile 'huge'"):
        config.default_results_dir("huge")


def test_write_table_records_provenance(tmp_path):
    smoke = theory.Config.for_profile("smoke")
    table = pd.DataFrame({"a": [1, 2], "b": [0.5, 0.25]})
    path = results.write_table(table, tmp_path, "example", smoke, wall_time_s=1.23456)
    assert path == tmp_path / "example.csv"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["example.csv", "example.json"]  # no temporaries left
    record = json.loads((tmp_path / "example.json").read_text())
    assert record["config_hash"] == smoke.config_hash()
    assert record["config"]["trials"] == smoke.trials and record["seed"] == smoke.seed
    assert {"commit", "dirty"} <= set(record["git"]) and "torch" in record["versions"]
    assert record["hardware"]["cpu_count"] == os.cpu_count() and record["wall_time_s"] == 1.235
    read_back, provenance = results.read_table(tmp_path, "example")
    pd.testing.assert_frame_equal(read_back, table)
    assert results.results_current(tmp_path, ["example"], smoke)
    assert not results.results_current(tmp_path, ["example"], dataclasses.replace(smoke, seed=9))


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    target = atomic.atomic_write_text(tmp_path / "sub" / "example.csv", "whole\n")
    assert target.read_text() == "whole\n" and [p.name for p in target.parent.iterdir()] == ["example.csv"]
    plain = tmp_path / "plain.csv"
    plain.write_text("x")
    assert target.stat().st_mode == plain.stat().st_mode  # the umask's mode, not a temporary file's 0600

    # A failure while writing leaves the old file in place and no temporary behind.
    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write_text(target, "half")
    assert target.read_text() == "whole\n"
    assert [p.name for p in target.parent.iterdir()] == ["example.csv"]


def test_read_table_says_how_to_make_missing_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the experiment that writes it first"):
        results.read_table(tmp_path / "cpu", "nothing")


def _stamps(folder) -> dict[str, tuple[int, int]]:
    """Inode and mtime per file: an atomic rewrite (a new file renamed into place) changes the inode."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_theory_smoke_is_deterministic_and_skips_when_current(tmp_path):
    config = theory.Config.for_profile("smoke")
    first = theory.run(config, out_dir=tmp_path / "a")
    second = theory.run(config, out_dir=tmp_path / "b")
    for name in theory.TABLES:
        pd.testing.assert_frame_equal(pd.read_csv(first / f"{name}.csv"), pd.read_csv(second / f"{name}.csv"))
    written = _stamps(first)
    assert theory.run(config, out_dir=first) == first
    assert _stamps(first) == written  # current results are reused, not rewritten
    theory.run(config, out_dir=first, force=True)
    rewritten = _stamps(first)
    assert all(rewritten[name] != stamp for name, stamp in written.items())  # force recomputes
    alignment = pd.read_csv(first / "theory_alignment.csv")
    assert (alignment.b_exact <= alignment.b_align + 1e-12).all()


def test_theory_command_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dalign_repro.experiments.theory", "--profile", "smoke", "--seed", "3",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "theory_alignment.json").read_text())
    assert record["seed"] == 3 and record["profile"] == "smoke"


def test_a_config_without_settings_for_a_profile_is_refused():
    from dalign_repro.experiments import llama_width

    class Partial(llama_width.Config):
        PROFILES = {"smoke": {}, "cpu": {}}

    with pytest.raises(ValueError, match="defines no settings for profile 'gpu'"):
        Partial.for_profile("gpu")
    assert llama_width.Config.for_profile("gpu").profile == "gpu"


def test_provenance_outside_a_git_checkout_takes_the_commit_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "REPO_ROOT", tmp_path)  # no .git here
    monkeypatch.setenv("DALIGN_GIT_COMMIT", "abc123")
    assert results._git_commit() == {"commit": "abc123", "dirty": None}
    monkeypatch.delenv("DALIGN_GIT_COMMIT")
    assert results._git_commit() == {"commit": None, "dirty": None}


# ---------------------------------------------------------------------------
# A table that no longer matches its provenance


def _written(tmp_path, rows: int = 5):
    smoke = theory.Config.for_profile("smoke")
    table = pd.DataFrame({"width": range(rows), "d_align": [0.5 * (i + 1) for i in range(rows)]})
    results.write_table(table, tmp_path, "example", smoke, wall_time_s=1.0)
    return tmp_path / "example.csv", tmp_path / "example.json"


def test_write_table_records_the_digest_of_what_it_wrote(tmp_path):
    import hashlib

    csv_path, json_path = _written(tmp_path)
    record = json.loads(json_path.read_text())
    assert record["rows"] == 5 and record["table_sha256"] == hashlib.sha256(csv_path.read_bytes()).hexdigest()


def test_table_cut_at_a_line_boundary_is_refused(tmp_path):
    csv_path, _ = _written(tmp_path)
    lines = csv_path.read_text().splitlines(keepends=True)
    csv_path.write_text("".join(lines[:-2]))  # two whole rows gone: still a valid CSV
    with pytest.raises(results.ResultsMismatchError, match="sha256") as error:
        results.read_table(tmp_path, "example")
    message = str(error.value)
    assert str(csv_path) in message and "--force" in message and "FORCE=1" in message and "PROFILE=smoke" in message


def test_edited_table_with_the_same_rows_is_refused(tmp_path):
    csv_path, _ = _written(tmp_path)
    csv_path.write_text(csv_path.read_text().replace("2.5", "9.5"))
    with pytest.raises(results.ResultsMismatchError, match="cut short, edited or replaced"):
        results.read_table(tmp_path, "example")


def test_table_written_before_the_digest_is_checked_by_row_count(tmp_path):
    csv_path, json_path = _written(tmp_path)
    record = json.loads(json_path.read_text())
    del record["table_sha256"]
    json_path.write_text(json.dumps(record))
    table, provenance = results.read_table(tmp_path, "example")  # reads as before
    assert len(table) == 5 and provenance["rows"] == 5
    lines = csv_path.read_text().splitlines(keepends=True)
    csv_path.write_text("".join(lines[:-1]))
    with pytest.raises(results.ResultsMismatchError, match=r"it has 4 row\(s\), the provenance records 5") as error:
        results.read_table(tmp_path, "example")
    assert str(csv_path) in str(error.value) and "--force" in str(error.value)
    assert isinstance(error.value, ValueError)


def test_unreadable_provenance_is_named(tmp_path):
    _, json_path = _written(tmp_path)
    json_path.write_text('{"rows": 5,')
    with pytest.raises(results.ResultsMismatchError, match="is not valid JSON.*--force"):
        results.read_table(tmp_path, "example")


def test_empty_table_still_reads(tmp_path):
    results.write_table(pd.DataFrame(), tmp_path, "nothing", theory.Config.for_profile("smoke"), wall_time_s=0.0)
    table, provenance = results.read_table(tmp_path, "nothing")
    assert table.empty and provenance["rows"] == 0


def test_committed_results_match_their_provenance():
    """Every committed table reads: the row counts (and digests, once recorded) agree."""
    checked = 0
    for json_path in sorted((config.REPO_ROOT / "results").glob("*/*.json")):
        if (json_path.with_suffix(".csv")).exists():
            results.read_table(json_path.parent, json_path.stem)
            checked += 1
    assert checked > 0
