"""The benchmarks run and save what they print (at sizes of seconds; ``make bench`` runs them at full size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from dalign_repro.config import REPO_ROOT


def _bench(script: str, *args: str, tmp_path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / script), "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_bench_training_compares_the_loop_with_a_minimal_one_and_the_matmul_limit(tmp_path):
    done = _bench("bench_training.py", "--profile", "smoke", "--widths", "16", "--steps", "2", "--repeats", "1",
                  tmp_path=tmp_path)
    table = pd.read_csv(tmp_path / "bench_training.csv")
    assert table.width.tolist() == [16]
    row = table.iloc[0]
    assert row.project_over_minimal > 0 and 0 < row.achieved_over_limit and row.flops_per_step > 0
    assert f"({row.project_over_minimal:.2f}x)" in done.stdout
    assert json.loads((tmp_path / "bench_training.json").read_text())["records"][0]["width"] == 16


def test_bench_projection_reads_the_dry_run_and_the_committed_provenance(tmp_path):
    done = _bench("bench_projection.py", "--profile", "smoke", "--sweeps", "llama_width", "--seeds", "4",
                  tmp_path=tmp_path)
    record = json.loads((tmp_path / "bench_projection.json").read_text())["records"][0]
    assert record["returncode"] == 0 and record["projected_serial_s"] >= record["projected_workers_s"] > 0
    assert "llama_width: projected" in done.stdout
    more = record["seeds4"]  # smoke has 2 seeds: the chapter at 4 takes longer
    assert more["projected_serial_s"] > record["projected_serial_s"] and more["projected_workers_s"] > 0
    assert "at 4 seeds: projected" in done.stdout


def test_bench_redundancy_times_whole_batches_against_micro_batches(tmp_path):
    done = _bench("bench_redundancy.py", "--profile", "smoke", "--widths", "16", "--examples", "8", tmp_path=tmp_path)
    row = pd.read_csv(tmp_path / "bench_redundancy.csv").iloc[0]
    assert row.width == 16 and row.examples == 8 and row.speedup > 0
    assert row.max_relative_difference <= 1e-6  # the same rows, to rounding
    assert f"({row.speedup:.1f}x)" in done.stdout
    assert json.loads((tmp_path / "bench_redundancy.json").read_text())["records"][0]["micro_batch"] == row.micro_batch


def test_bench_resnet_memory_times_both_memory_orders_of_one_model(tmp_path):
    done = _bench("bench_resnet_memory.py", "--profile", "smoke", "--widths", "4", "--steps", "1", "--repeats", "1",
                  tmp_path=tmp_path)
    row = pd.read_csv(tmp_path / "bench_resnet_memory.csv").iloc[0]
    assert row.width == 4 and row.train_ratio > 0 and row.capture_ratio > 0
    assert 0 < row.q_relative_difference < 1e-4 and 0 < row.q_error_nchw < 1e-4 and 0 < row.q_error_nhwc < 1e-4
    assert f"({row.train_ratio:.2f}x)" in done.stdout


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


def test_bench_command_prints_the_start_up_breakdown_and_the_redundancy_share(tmp_path):
    done = _bench("bench_command.py", "--quick", tmp_path=tmp_path)
    row = pd.read_csv(tmp_path / "bench_command.csv").iloc[0]
    # each figure is measured on its own (a quick run has no warm-up round), so their order is the machine's load,
    # not the code's: the test holds the arithmetic that joins them, not a timing
    assert min(row.command_s, row.import_torch_s, row.work_s, row.check_default_s) > 0
    assert row.own_s == pytest.approx(row.command_s - row.import_torch_s - row.work_s)
    assert row.redundancy_share == pytest.approx(row.check_default_s / row.command_s)
    assert f"own cost {row.own_s:.2f} s" in done.stdout
    assert f"{100 * row.redundancy_share:.0f}% of the command" in done.stdout
    assert json.loads((tmp_path / "bench_command.json").read_text())["imports"]  # where the own time goes


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO_ROOT / "benchmarks").glob("bench_*.py")))
def test_every_benchmark_finds_its_own_helpers_beside_a_package_of_the_same_name(script, tmp_path):
    """The bench's environment holds Opacus 1.6.0, which installs a top-level package named ``benchmarks`` into
    site-packages: each script must still import this folder's ``benchmarks._bench`` (``make bench`` once lost two
    benchmarks to it). Here such a package is put ahead on the path."""
    shadow = tmp_path / "site" / "benchmarks"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(shadow.parent)})
    assert done.returncode == 0, done.stderr[-2000:]
