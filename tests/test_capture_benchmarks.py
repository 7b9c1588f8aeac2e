"""The capture's benchmarks run at sizes of seconds and print and save what they measured (``make bench`` runs them
at full size)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from dalign_core.config import REPO_ROOT


def _bench(script: str, *args: str, tmp_path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / script), "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_bench_capture_prints_the_capture_ratio_with_the_self_check(tmp_path):
    done = _bench("bench_capture.py", "--quick", "--widths", "32", "--methods", "bare", "capture", "--repeats", "1",
                  "--threads", "1", tmp_path=tmp_path)
    ratio = json.loads((tmp_path / "bench_capture.json").read_text())["capture_ratio"]
    assert ratio["status"] == "ok" and (ratio["batch_size"], ratio["seq_len"], ratio["width"]) == (8, 64, 128)
    assert ratio["ratio"] == ratio["capture_s"] / ratio["bare_s"] > 0 and ratio["ratio_unchecked"] > 0
    assert f"{ratio['ratio']:.2f}x with the determinism self-check" in done.stdout


def test_bench_sweep_measure_compares_a_pass_per_reduction_with_one_pass(tmp_path):
    done = _bench("bench_sweep_measure.py", "--profile", "smoke", "--examples", "8", "--steps", "1", "--repeats", "1",
                  tmp_path=tmp_path)
    old, new = pd.read_csv(tmp_path / "bench_sweep_measure.csv").itertuples()
    assert (old.design, new.design) == ("pass_per_reduction", "one_pass") and old.reductions == "full+shared"
    assert old.capture_passes_per_run == 2 * new.capture_passes_per_run and new.checks_per_run == 1
    assert old.training_s == new.training_s > 0 and 0 < new.capture_share < 1 and 0 < old.capture_share < 1
    record = json.loads((tmp_path / "bench_sweep_measure.json").read_text())
    assert record["projected_run_change_s"] == pytest.approx(new.run_s - old.run_s)
    assert f"({100 * new.capture_share:.1f}% in capture)" in done.stdout
