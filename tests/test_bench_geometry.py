"""The geometry benchmarks run at sizes of seconds and print each figure beside its target (``make bench`` runs
them at full size)."""

from __future__ import annotations

import json

import pandas as pd

from test_benchmarks import _bench  # tests/ is on sys.path


def test_bench_estimators_prints_the_gram_against_its_floor_and_its_accuracy(tmp_path):
    done = _bench("bench_estimators.py", "--quick", "--shapes", "512x4096", "--dims", "256", "--ns", "64",
                  tmp_path=tmp_path)
    row = pd.read_csv(tmp_path / "bench_estimators_gram.csv").iloc[0]
    assert (row.n, row.d) == (512, 4096) and row.floor_s > 0 and row.estimate_s > 0 and row.float64_s > 0
    assert row.estimate_over_floor == row.estimate_s / row.floor_s
    assert row.worst_se < 0.01 and row.d_align > 0  # the float32 path at its accuracy target
    assert f"= {row.estimate_over_floor:.2f}x (target <= 1.3x)" in done.stdout
    assert f"SE of the float64 result ({row.worst_moment}; target <= 0.01)" in done.stdout
    meta = json.loads((tmp_path / "bench_estimators_gram.json").read_text())
    assert meta["quick"] is True and meta["met"] == bool(row.estimate_over_floor <= 1.3 and row.worst_se <= 0.01)
    memory = pd.read_csv(tmp_path / "bench_estimators.csv")
    assert set(memory.method) == {"u-statistic", "plug-in"} and (memory.status == "ok").all()


def test_bench_misalignment_times_draws_and_both_ways_of_summing(tmp_path):
    done = _bench("bench_misalignment.py", "--quick", "--pools", "128", "--trials", "20000", tmp_path=tmp_path)
    table = pd.read_csv(tmp_path / "bench_misalignment.csv")
    assert [(row.M, row.K) for row in table.itertuples()] == [(4, 4), (16, 16), (32, 32)]
    assert table.same_p_hat.all() and (table.max_abs_difference < 1e-12).all()
    assert (table.first_s > 0).all() and ((0 <= table.draw_share) & (table.draw_share <= 1)).all()
    # M K < 512: only gathered; at 32 x 32 the first call raced both ways, which gave the same bits
    assert list(table.raced) == [False, False, True] and set(table.chosen[:2]) == {"gather"}
    assert table.same_bits.iloc[2] and table.max_abs_difference.iloc[2] == 0
    assert "(target <= 1.2)" in done.stdout and "p̂ the same in 3 of 3 budgets (target: all)" in done.stdout
