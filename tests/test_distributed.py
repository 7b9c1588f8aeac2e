"""Several ranks, one experiment: job grid, data-parallel training, sharded q pools (training.distributed, .sharded).

The end-to-end tests start ``torchrun --nproc_per_node=2`` (as ``python -m
torch.distributed.run``) on the CPU with the gloo backend, running
tests/_distributed_worker.py: the toy sweep of tests/test_sweep.py over two ranks
gives the tables of one process (itself sharing the grid with one worker per core), exactly; a rank killed mid-training, then the same
command again, gives them too; the widest width trained by both ranks together (DDP)
matches to float rounding; and data-parallel training and the sharded Gram estimates
equal their one-process versions. The rest runs in this process, a world of one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from dalign_core import device
from dalign_repro.training import distributed, sharded
from dalign_repro.training.distributed import Job
from dalign_core.geometry.estimators import estimate_geometry
from dalign_core.geometry.misalignment import cross_gram

WORKER = Path(__file__).resolve().parent / "_distributed_worker.py"
TABLES = ("toy_lr", "toy_runs", "toy_geometry", "toy_misalignment", "toy_trend")

needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available")


def _launch(args: list[str], checkpoints: Path, ranks: int | None = 2) -> subprocess.CompletedProcess:
    """The worker under ``torchrun --standalone --nproc_per_node=ranks`` (None: plain python, a world of one)."""
    env = {k: v for k, v in os.environ.items() if k not in (distributed.RANKS_PER_JOB_VARIABLE, "RANK", "WORLD_SIZE",
                                                            "DALIGN_WORKERS", "DALIGN_THREADS")}
    env.update(OMP_NUM_THREADS="1", DALIGN_CHECKPOINTS=str(checkpoints), PYTHONUNBUFFERED="1")
    launcher = [] if ranks is None else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    return subprocess.run([sys.executable, *launcher, str(WORKER), *args], env=env, capture_output=True, text=True,
                          timeout=600)


def _ok(run: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-4000:]}\n{run.stderr[-8000:]}"
    return run


def _tables(folder: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_csv(folder / f"{name}.csv").drop(columns=["seconds"], errors="ignore") for name in TABLES}


def _assert_same_tables(got: Path, want: Path, **tolerance) -> None:
    expected = _tables(want)
    for name, table in _tables(got).items():
        if tolerance:  # a resampled sign may flip where a statistic sits at float rounding from 0: one draw in 500
            resampled = [c for c in table.columns if c.startswith("p_misalign")]
            pd.testing.assert_frame_equal(table[resampled], expected[name][resampled], check_exact=False, atol=5e-3)
            rounded = resampled + [c for c in ("means",) if c in table]  # the trend's means, printed to 4 digits
            table, expected[name] = table.drop(columns=rounded), expected[name].drop(columns=rounded)
        pd.testing.assert_frame_equal(table, expected[name], check_exact=not tolerance, **tolerance)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The toy sweep's tables from one plain process (no torchrun): the reference."""
    root = tmp_path_factory.mktemp("one-process")
    _ok(_launch(["sweep", "--out", str(root / "results")], root / "checkpoints", ranks=None))
    return root / "results"


# ----------------------------------------------------------------------------- two ranks (torchrun, gloo)


@needs_gloo
@pytest.mark.slow  # torchrun starts two ranks
def test_two_ranks_write_the_tables_of_one_process(one_process, tmp_path):
    _ok(_launch(["sweep", "--out", str(tmp_path / "results")], tmp_path / "checkpoints"))
    _assert_same_tables(tmp_path / "results", one_process)
    record = json.loads((tmp_path / "results" / "toy_runs.json").read_text())
    assert record["world_size"] == 2 and [r["rank"] for r in record["ranks"]] == [0, 1]
    assert all("cpu_count" in r and "host" in r for r in record["ranks"])
    # every rank computes on one thread and is its own (only) worker; the plain process shares its grid with workers
    assert all(r["threads_per_process"] == 1 and r["workers"] == 1 for r in record["ranks"])
    alone = json.loads((one_process / "toy_runs.json").read_text())["hardware"]
    assert alone["threads_per_process"] == 1 and alone["workers"] == alone["usable_cores"]
    # the runs are in toy_runs.csv: the provenance points there and counts them, no copy
    assert {k: record["runs"][k] for k in ("table", "count", "trained_ok")} == {"table": "toy_runs.csv", "count": 6,
                                                                                "trained_ok": 6}
    assert json.loads((one_process / "toy_runs.json").read_text())["world_size"] == 1
    assert not (tmp_path / "results" / "partial").exists()  # the jobs folder, and partial/ with it, are gone


@needs_gloo
@pytest.mark.slow  # torchrun starts two ranks
def test_a_rank_killed_mid_run_then_restarted_finishes_with_the_same_tables(one_process, tmp_path):
    out, checkpoints = tmp_path / "results", tmp_path / "checkpoints"
    killed = _launch(["sweep", "--out", str(out), "--kill-rank", "1", "--kill-at-step", "45"], checkpoints)
    assert killed.returncode != 0  # rank 1 died in its second training; torchrun stopped rank 0
    assert not (out / "toy_runs.json").exists()
    kept = [p.name for p in out.glob("partial/*/*.json")]
    assert 0 < len(kept) < 12, kept  # some jobs finished, not all
    again = _ok(_launch(["sweep", "--out", str(out)], checkpoints))
    assert f"reusing {len(kept)} finished job(s)" in again.stderr
    _assert_same_tables(out, one_process)


@needs_gloo
@pytest.mark.slow  # torchrun starts two ranks
def test_the_widest_width_trained_by_both_ranks_together_matches_one_process(one_process, tmp_path):
    _ok(_launch(["sweep", "--out", str(tmp_path / "results"), "--ranks-per-job", "24:2"], tmp_path / "checkpoints"))
    # data-parallel AdamW: the same numbers to float rounding (measured: 1e-5 relative at most)
    _assert_same_tables(tmp_path / "results", one_process, rtol=1e-3, atol=1e-9)
    record = json.loads((tmp_path / "results" / "toy_runs.json").read_text())
    assert record["ranks_per_job"] == {"8": 1, "16": 1, "24": 2}


@needs_gloo
@pytest.mark.slow  # torchrun starts two ranks
def test_data_parallel_training_and_sharded_gram_equal_one_process(tmp_path):
    run = _ok(_launch(["checks"], tmp_path / "checkpoints"))
    assert "checks OK" in run.stdout


# ----------------------------------------------------------------------------- a world of one, in this process


def test_the_environment_torchrun_sets_is_read(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert device.context() == device.Context() and not device.context().distributed
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("GROUP_RANK", "1")
    ctx = device.context()
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node) == (5, 8, 1, 4, 1)
    assert ctx.distributed and not ctx.is_main
    monkeypatch.setenv("RANK", "8")
    with pytest.raises(ValueError, match="RANK=8 is outside WORLD_SIZE=8"):
        device.context()


def test_the_plan_is_deterministic_longest_first_and_keeps_groups_on_aligned_blocks():
    jobs = [Job(f"w{w}_{k}", cost=float(w * w), ranks=2 if w >= 3 else 1) for w in (1, 2, 3, 4) for k in range(3)]
    plan = distributed.plan(jobs, 4)
    assert plan == distributed.plan(list(reversed(jobs)), 4)  # the same on every rank, whatever order it was given
    assert [a.job.name for a in plan][:3] == ["w4_0", "w4_1", "w4_2"]
    assert all(a.ranks in ((0, 1), (2, 3)) for a in plan if a.job.ranks == 2)
    # one total order: on every rank the jobs it shares come in the same relative order (no cycle of waiting)
    order = {a.job.name: i for i, a in enumerate(plan)}
    for rank in range(4):
        mine = [order[a.job.name] for a in plan if rank in a.ranks]
        assert mine == sorted(mine)
    # no rank runs two jobs at once, and the projected end is near the ideal
    for rank in range(4):
        spans = sorted((a.start, a.end) for a in plan if rank in a.ranks)
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:]))
    total = sum(j.cost for j in jobs)
    assert max(a.end for a in plan) <= 1.5 * total / 4
    with pytest.raises(ValueError, match="must divide the world size 4"):
        distributed.plan([Job("x", ranks=3)], 4)


def test_ranks_per_job_reads_a_number_or_width_thresholds(monkeypatch):
    widths = (512, 1024, 2560, 3072)
    monkeypatch.delenv(distributed.RANKS_PER_JOB_VARIABLE, raising=False)
    assert distributed.ranks_per_job(widths, 8) == dict.fromkeys(widths, 1)
    assert distributed.ranks_per_job(widths, 8, "2") == dict.fromkeys(widths, 2)
    assert distributed.ranks_per_job(widths, 8, "2560:2,3072:4") == {512: 1, 1024: 1, 2560: 2, 3072: 4}
    monkeypatch.setenv(distributed.RANKS_PER_JOB_VARIABLE, "3072:8")
    assert distributed.ranks_per_job(widths, 8)[3072] == 8
    assert distributed.ranks_per_job(widths, 1) == dict.fromkeys(widths, 1)  # a world of one: one rank each
    with pytest.raises(ValueError, match="do not divide the world size 8"):
        distributed.ranks_per_job(widths, 8, "3")
    with pytest.raises(ValueError, match="width:ranks pairs"):
        distributed.ranks_per_job(widths, 8, "wide")


def test_run_jobs_in_a_world_of_one_keeps_and_reuses_finished_jobs(tmp_path):
    calls = []

    def compute(job, group):
        assert group is None
        calls.append(job.name)
        return {"value": job.payload * 2}

    jobs = [Job(f"j{i}", payload=i) for i in range(3)]
    finished = []
    # workers=1: in this process, in the order given (tests/test_workers.py runs grids on several workers)
    assert distributed.run_jobs(None, jobs, compute, workers=1) == {f"j{i}": {"value": 2 * i} for i in range(3)}
    first = distributed.run_jobs(tmp_path, jobs[:2], compute, finished=lambda job, lookup: finished.append(
        (job.name, lookup(job.name))), workers=1)
    assert finished == [("j0", {"value": 0}), ("j1", {"value": 2})]
    calls.clear()
    assert distributed.run_jobs(tmp_path, jobs, compute, workers=1) == {**first, "j2": {"value": 4}}
    assert calls == ["j2"]  # j0 and j1 were read back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j0.json", "j1.json", "j2.json"]


def test_sharded_estimates_in_a_world_of_one_are_the_one_shot_ones():
    generator = torch.Generator().manual_seed(0)
    Q = torch.randn(20, 6, generator=generator, dtype=torch.float64) + 0.5
    test = torch.randn(9, 6, generator=generator, dtype=torch.float64)
    got, want = sharded.sharded_geometry(Q), estimate_geometry(Q)
    assert got.d_align == pytest.approx(want.d_align, rel=1e-12) and got.n == 20 and got.d == 6
    assert got.intervals["d_align"].se == pytest.approx(want.intervals["d_align"].se, rel=1e-10)
    assert torch.allclose(sharded.sharded_cross_gram(Q, test), cross_gram(Q, test), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- damaged job files


def _kept(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(text)


TRIAL = {"family": "toy", "width": 8, "lr": 0.01, "validation_loss": 1.5}
RUN = {"geometry": [{"width": 8}], "redundancy": [], "runs": [{"width": 8, "seed": 0}]}


@pytest.mark.parametrize("name,text", [
    ("N8_seed0", "{}"),  # emptied: was reused, and the run left every table for good
    ("N8_seed0", '{"geometry": [{"width": 8}], "runs": [{"wid'),  # truncated
    ("N8_seed0", '{"geometry": [{"width": 8}], "redundancy": []}'),  # no runs row
    ("N8_seed0", '{"geometry": 3, "runs": [{"width": 8}]}'),  # a table that is not a list of rows
    ("N8_seed0", "[1, 2]"),
    ("lr_N8_lr0.01", '{"family": "toy", "width": 8}'),  # a rate trial without its loss
    ("lr_N8_lr0.01", '{"validation_loss": "low"}'),
    ("full_N8_lr0.01", "null"),
    ("j0", "{}"),
    ("j0", ""),
])
def test_a_damaged_job_file_is_named_and_recomputed_never_reused(tmp_path, caplog, name, text):
    good = {"N8_seed0": RUN, "lr_N8_lr0.01": TRIAL, "full_N8_lr0.01": TRIAL, "j0": {"value": 1}}[name]
    calls = []

    def compute(job, group):
        calls.append(job.name)
        return good

    folder = tmp_path / "jobs"
    _kept(folder, name, text)
    store = distributed._Store(folder)
    with caplog.at_level("WARNING", logger="dalign_repro.training.distributed"):
        assert store.get(name) is None and store.names() == set()
        assert distributed.run_jobs(folder, [Job(name)], compute, workers=1) == {name: good}
    assert calls == [name]
    assert f"damaged job file {folder / (name + '.json')}: recomputing" in caplog.text
    assert json.loads((folder / f"{name}.json").read_text()) == good  # replaced by the recomputed result
    calls.clear()
    assert distributed.run_jobs(folder, [Job(name)], compute, workers=1) == {name: good} and calls == []


def test_damaged_job_files_are_recomputed_by_the_workers_too(tmp_path, caplog):
    folder = tmp_path / "jobs"
    jobs = [Job(f"N{w}_seed0", cost=float(w), payload=w) for w in (4, 8, 16)]
    _kept(folder, "N4_seed0", json.dumps({**RUN, "runs": [{"width": 4}]}))
    _kept(folder, "N8_seed0", "{}")
    computed = []
    with caplog.at_level("WARNING", logger="dalign_repro.training.distributed"):
        results = distributed.run_jobs(folder, jobs, lambda job, group: {**RUN, "runs": [{"width": job.payload}]},
                                       workers=2, finished=lambda job, lookup: computed.append(job.name))
    assert sorted(computed) == ["N16_seed0", "N8_seed0"]  # N4 was reused, the emptied N8 recomputed
    assert [results[j.name]["runs"][0]["width"] for j in jobs] == [4, 8, 16]
    assert "damaged job file" in caplog.text and "N8_seed0.json" in caplog.text


def test_a_result_that_could_not_be_read_back_is_not_kept(tmp_path):
    with pytest.raises(ValueError, match="job N8_seed0 computed a result that cannot be kept"):
        distributed.run_jobs(tmp_path, [Job("N8_seed0")], lambda job, group: {}, workers=1)
    assert not list(tmp_path.glob("*.json"))


def test_job_result_problem_accepts_the_sweeps_results():
    assert distributed.job_result_problem("lr_N8_lr0.01", {**TRIAL, "validation_loss": float("nan")}) is None
    assert distributed.job_result_problem("N8_seed0", RUN) is None
    assert distributed.job_result_problem("pythia-70m@step1000", {"rows": [], "checkpoint": {"path": "x"}}) is None
    assert distributed.job_result_problem("N8_seed0", {"runs": []}) is not None


def test_remove_jobs_leaves_no_empty_partial_folder(tmp_path):
    partial = tmp_path / "out" / "partial"
    for name in ("toy-abc", "toy-def"):
        _kept(partial / name, "N8_seed0", json.dumps(RUN))
    distributed.remove_jobs(partial / "toy-abc")
    assert sorted(p.name for p in partial.iterdir()) == ["toy-def"]  # another experiment's jobs stay
    distributed.remove_jobs(partial / "toy-def")
    assert not partial.exists() and (tmp_path / "out").is_dir()
    distributed.remove_jobs(partial / "toy-def")  # already gone: nothing to do
    distributed.remove_jobs(None)
