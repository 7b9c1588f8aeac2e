"""Nothing lost, nothing silently wrong, in the files an experiment writes and reads back.

`--force` on a full disk keeps the old results (a simulated ENOSPC); a results CSV cut short is
recomputed, never reused; `python -m` records its overrides under the experiment's own name.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dalign_core import atomic, results
from dalign_core.config import REPO_ROOT
from dalign_core.experiments import _runner, theory


def _probe_compute(config, out_dir):
    return {"first": pd.DataFrame({"trials": [config.trials]}),
            "second": pd.DataFrame({"trials": [config.trials] * 2})}, {}


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _full_disk_after(monkeypatch, writes: int) -> None:
    """Every file written after the first ``writes`` fails as on a full disk (ENOSPC), as a real one would at fsync."""
    real = os.fsync
    calls = {"n": 0}

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] > writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)


@pytest.mark.parametrize("writes", [0, 1, 3])
def test_force_on_a_full_disk_keeps_every_old_file(tmp_path, monkeypatch, writes):
    config = theory.Config.for_profile("smoke")
    _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path)
    before = _contents(tmp_path)
    assert sorted(before) == ["first.csv", "first.json", "second.csv", "second.json"]
    _full_disk_after(monkeypatch, writes)
    with pytest.raises(OSError) as error:
        _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path, force=True)
    assert error.value.errno == errno.ENOSPC
    assert _contents(tmp_path) == before  # no file replaced, no temporary left behind
    assert results.results_current(tmp_path, ("first", "second"), config)


def test_write_table_on_a_full_disk_keeps_the_old_provenance(tmp_path, monkeypatch):
    config = theory.Config.for_profile("smoke")
    results.write_table(pd.DataFrame({"a": [1]}), tmp_path, "t", config, 1.0)
    before = _contents(tmp_path)
    _full_disk_after(monkeypatch, 1)  # the CSV's temporary completes, the JSON's does not
    with pytest.raises(OSError):
        results.write_table(pd.DataFrame({"a": [2]}), tmp_path, "t", config, 1.0)
    assert _contents(tmp_path) == before


def test_the_command_line_says_a_full_disk_in_one_line_and_keeps_the_results(tmp_path, monkeypatch, capsys):
    config = theory.Config.for_profile("smoke")
    _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path)
    before = _contents(tmp_path)
    _full_disk_after(monkeypatch, 2)

    def run(config, out_dir=None, force=False):
        return _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=out_dir,
                                      force=force)

    with pytest.raises(SystemExit) as exit_:
        _runner.main(theory.Config, run, argv=["--profile", "smoke", "--out", str(tmp_path), "--force"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and str(tmp_path) in err[0], err
    assert "Traceback" not in "\n".join(err)
    assert _contents(tmp_path) == before


def test_a_truncated_results_csv_is_not_reused(tmp_path):
    config = theory.Config.for_profile("smoke")
    _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path)
    assert results.results_current(tmp_path, ("first", "second"), config)
    csv_path = tmp_path / "second.csv"
    csv_path.write_bytes(csv_path.read_bytes()[:-2])  # cut short
    assert not results.results_current(tmp_path, ("first", "second"), config)
    _runner.run_experiment("probe", ("first", "second"), config, _probe_compute, out_dir=tmp_path)
    table, _ = results.read_table(tmp_path, "second")  # recomputed: it reads again
    assert len(table) == 2
    (tmp_path / "first.json").write_text("{")  # an unreadable provenance: not current either
    assert not results.results_current(tmp_path, ("first",), config)


def test_python_m_records_its_overrides_under_the_experiments_name(tmp_path):
    """Under ``python -m`` the config's module is ``__main__``: the record must still name the experiment, so a
    second experiment writing into the same folder adds its own record instead of replacing the first's."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DALIGN_WORKERS": "1"}
    (tmp_path / "overrides.json").write_text(json.dumps({"profile": "smoke", "experiments": {"other": {"seed": 1}}}))
    proc = subprocess.run([sys.executable, "-m", "dalign_core.experiments.theory", "--profile", "smoke",
                           "--set", "trials=500", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "overrides.json").read_text())
    assert record["experiments"] == {"other": {"seed": 1}, "theory": {"trials": 500}}
