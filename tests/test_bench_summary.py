"""``make bench`` ends with every figure beside its target (benchmarks/summary.py), read from what each benchmark saved."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest

from dalign_repro.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import summary  # noqa: E402
from _bench import target  # noqa: E402


def test_a_target_is_met_on_its_own_side_and_a_figure_without_one_is_not_judged():
    assert target("ratio", 1.05, 1.1)["met"] is True
    assert target("ratio", 1.15, 1.1)["met"] is False
    assert target("count", 3, 4, unit="", at_least=True)["met"] is False
    assert target("count", 4, 4, unit="", at_least=True)["met"] is True
    assert target("speed-up", 7.5, None)["met"] is None
    assert target("ratio", math.nan, 1.1)["met"] is None  # a benchmark that could not measure is not a pass


def test_the_summary_prints_each_target_with_its_verdict_and_names_the_benchmarks_without_one(tmp_path, capsys):
    (tmp_path / "bench_a.json").write_text(json.dumps({
        "benchmark": "bench_a", "loadavg_end": [1.5, 1.0, 1.0], "cpu_count": 2,
        "targets": [target("capture / fastest peer", 1.31, 1.1, peers="torch.func 0.40 s"),
                    target("redundancy share", 0.12, 0.25, unit="%")]}))
    (tmp_path / "bench_b.json").write_text(json.dumps({"benchmark": "bench_b", "records": []}))
    (tmp_path / "bench_c.json").write_text("{not json")
    assert summary.main(["--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    peer_line = next(line for line in out.splitlines() if "capture / fastest peer" in line)
    assert "1.31x" in peer_line and "<= 1.10x" in peer_line and "MISSES" in peer_line and "torch.func 0.40 s" in peer_line
    share_line = next(line for line in out.splitlines() if "redundancy share" in line)
    assert "12%" in share_line and "<= 25%" in share_line and "meets" in share_line and "1.5/2" in share_line
    assert "1 of 2 targets met; missed: bench_a: capture / fastest peer" in out
    assert "figures without a target (each benchmark prints its own): bench_b" in out
    assert "could not read bench_c.json" in err


def test_the_summary_of_a_missing_folder_is_one_line_that_says_what_to_run(tmp_path):
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "summary.py"), "--out",
                           str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "run `make bench`" in done.stderr


@pytest.mark.parametrize("script, args", [("bench_misalignment.py", ("--quick", "--pools", "64", "--trials", "300"))])
def test_a_benchmark_saves_its_targets_and_the_summary_reads_them(tmp_path, script, args):
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / script), "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / script.replace(".py", ".json")).read_text())["targets"]
    assert saved and all(t["met"] in (True, False, None) for t in saved)
    worst = max(r["chosen_over_best"] for r in json.loads((tmp_path / "bench_misalignment.json").read_text())["records"])
    assert saved[0]["measured"] == pytest.approx(worst)
    table = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "summary.py"), "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=120).stdout
    assert f"{worst:.2f}x" in table and "targets met" in table


def test_the_capture_against_its_peers_shows_its_rounds_beside_the_best_passes():
    """The judged figure stays the best capture pass over the fastest peer's best; each round's own ratio (the two run
    one after the other) is summarized beside it, the median of the rounds' ratios, not a ratio of medians."""
    import bench_capture  # noqa: PLC0415  (benchmarks/ is on the path above)

    records = {"capture": {"status": "ok", "wall_s": 1.0, "times_s": [1.0, 1.3, 1.2, 1.6]},
               "vmap": {"status": "ok", "wall_s": 1.2, "times_s": [1.2, 1.3, 1.4, 1.5]},
               "backpack": {"status": "ok", "wall_s": 0.9, "times_s": [0.9, 1.0, 1.5, 1.6]},
               "opacus": {"status": "failed", "wall_s": 0.1, "times_s": []}}
    versus = bench_capture._versus_peers(1.0, records)
    assert versus["best_peer"] == "backpack" and versus["capture_over_best_peer"] == pytest.approx(1.0 / 0.9)
    rounds = [1.0 / 0.9, 1.3 / 1.0, 1.2 / 1.5, 1.6 / 1.6]  # round by round, against the best peer only
    assert versus["paired_rounds"] == 4  # the median: the middle two of the four rounds' ratios
    assert versus["paired_median"] == pytest.approx((1.0 / 0.9 + 1.6 / 1.6) / 2)
    assert versus["paired_median"] == pytest.approx(statistics.median(rounds))
    assert versus["paired_q25"] <= versus["paired_median"] <= versus["paired_q75"]
    assert "round by round 1.06x" in bench_capture._peer_line("here", versus)
    assert "round by round 1.06x" in bench_capture.peer_target("capture / fastest peer", versus)["peers"]
    assert "paired_median" not in bench_capture._versus_peers(1.0, {**records, "capture": {"wall_s": 1.0}})
