"""Building the book leaves every committed file as it was: the claims table it shows is judged by the
current code, but a committed table is never rewritten by a book build."""

from __future__ import annotations

import json
import shutil
import subprocess

import pandas as pd
import pytest

from dalign_repro.experiments import claims

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(folder, *arguments):
    subprocess.run(["git", *arguments], cwd=folder, check=True, capture_output=True)


@pytest.fixture
def committed_results(tmp_path, monkeypatch):
    """A git repository whose results/cpu holds a committed claims table written by some older judging code."""
    monkeypatch.setenv("DALIGN_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    results = repo / "results" / "cpu"
    results.mkdir(parents=True)
    _git(repo, "init", "-q")
    config = claims.Config.for_profile("cpu")
    claims.run(config, out_dir=results)  # no input tables: every claim reads "not run"
    record = json.loads((results / "claims.json").read_text())
    record["inputs"]["code"]["sha256"] = "0" * 16  # judged by other code than today's
    (results / "claims.json").write_text(json.dumps(record, indent=2) + "\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "results")
    return config, results


def test_a_stale_committed_table_is_judged_in_memory_and_left_as_it_was(committed_results, monkeypatch):
    config, results = committed_results
    before = {path.name: path.read_bytes() for path in results.iterdir()}
    table, provenance, stored = claims.current(config, out_dir=results)
    assert not stored and provenance["judged_in_memory"]
    assert {path.name: path.read_bytes() for path in results.iterdir()} == before
    pd.testing.assert_frame_equal(table, pd.read_csv(results / "claims.csv"))  # the same claims, judged now
    # A second reader (the landing page after the claims chapter) takes the cached judgement.
    monkeypatch.setattr(claims, "claims_table", lambda out_dir: (_ for _ in ()).throw(AssertionError("judged twice")))
    again, _, _ = claims.current(config, out_dir=results)
    pd.testing.assert_frame_equal(again, table)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=results, capture_output=True, text=True, check=True)
    assert status.stdout == ""


def test_an_untracked_table_is_rewritten_and_force_rewrites_a_committed_one(committed_results):
    config, results = committed_results
    # force (make notebooks FORCE=1) is the one way a build rewrites the committed table.
    _, provenance, stored = claims.current(config, out_dir=results, force=True)
    assert stored and "judged_in_memory" not in provenance
    assert json.loads((results / "claims.json").read_text())["inputs"] == claims._inputs(results)
    # An up-to-date table is read as it is.
    table, _, stored = claims.current(config, out_dir=results)
    assert stored and len(table)


def test_a_committed_folder_without_a_claims_table_gets_none(committed_results):
    config, results = committed_results
    other = results.parent / "gpu"
    other.mkdir()
    (other / "theory_alignment.csv").write_text("a\n1\n")
    _git(other, "add", "theory_alignment.csv")
    _git(other, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "gpu")
    table, _, stored = claims.current(claims.Config.for_profile("gpu"), out_dir=other)
    assert not stored and len(table) and sorted(p.name for p in other.iterdir()) == ["theory_alignment.csv"]


def test_a_figure_style_change_does_not_make_the_claims_stale():
    modules = [path for folder in claims.JUDGES for path in
               (__import__("pathlib").Path(claims.dalign_repro.__file__).parent / folder).rglob("*.py")]
    names = {path.as_posix().split("dalign_repro/", 1)[1] for path in modules}
    assert set(claims.DRAWS_ONLY) <= names  # the excluded modules exist where the digest would read them
