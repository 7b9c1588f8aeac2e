"""Every core, one thread each (dalign_repro.training.workers): a CPU job grid over forked one-thread workers.

The same results on one worker and on two, bit for bit (a toy grid of tiny MLPs, and the
toy width sweep of tests/test_sweep.py); a job that raises is named with its traceback; a
killed worker never leaves the parent waiting; Ctrl-C stops the workers and a rerun
computes only what is missing; the provenance records the threads and the workers.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_sweep import ToyConfig, ToyFamily  # noqa: E402

from dalign_repro.training import distributed  # noqa: E402
from dalign_repro.sweep import run as sweep
from dalign_repro.sweep.plan import jobs_dir
from dalign_core import device
from dalign_repro.training import workers
from dalign_repro.config import ExperimentConfig  # noqa: E402
from dalign_repro.training.distributed import Job  # noqa: E402
from dalign_repro.experiments._runner import run_experiment  # noqa: E402

JOBS = [Job(f"mlp_w{width}_s{seed}", cost=float(width), payload=(width, seed)) for width in (4, 8, 16) for seed in (0, 1)]


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    """Each test starts from a process that was told nothing, and leaves it so."""
    for name in (workers.WORKERS_VARIABLE, device.THREADS_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    state, configured, threads = dict(workers._state), dict(device._state), torch.get_num_threads()
    yield
    workers._state.clear()
    workers._state.update(state)
    device._state.clear()
    device._state.update(configured)
    torch.set_num_threads(threads)
    assert not multiprocessing.active_children()  # no worker outlives its call


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail instead of hanging: SIGALRM raises in the main thread after ``seconds``."""
    def expired(signum, frame):
        raise TimeoutError(f"still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def train_mlp(job: Job, group=None) -> dict:
    """A few seeded AdamW steps of a tiny MLP: every float depends on the job alone (and on the thread count)."""
    assert group is None
    width, seed = job.payload
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, width), nn.GELU(), nn.Linear(width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(100 + seed)
    x, y = torch.randn(64, 6, generator=data), torch.randn(64, 1, generator=data)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    return {"losses": losses, "weight_sum": float(weights.sum()), "weight_sq": float((weights ** 2).sum()),
            "pid": os.getpid(), "threads": torch.get_num_threads()}


def _numbers(results: dict) -> dict:
    return {name: {k: v for k, v in result.items() if k != "pid"} for name, result in results.items()}


# ----------------------------------------------------------------------------- the same results, any number of workers


def test_a_grid_gives_bitwise_the_same_results_on_one_and_two_workers(tmp_path):
    device.configure("cpu")
    one = distributed.run_jobs(tmp_path / "one", JOBS, train_mlp, workers=1)
    finished = []
    with deadline(120):
        two = distributed.run_jobs(tmp_path / "two", JOBS, train_mlp, workers=2,
                                   finished=lambda job, lookup: finished.append((job.name, lookup(job.name))))
    assert list(two) == [job.name for job in JOBS]  # in the order given, as one process returns them
    assert _numbers(two) == _numbers(one)  # floats through JSON: exact
    assert {r["threads"] for r in two.values()} == {1} == {r["threads"] for r in one.values()}
    pids = {r["pid"] for r in two.values()}
    assert os.getpid() not in pids and len(pids) == 2  # both workers computed, none of it here
    assert sorted(name for name, _ in finished) == sorted(two) and all(result == two[name] for name, result in finished)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(f"{job.name}.json" for job in JOBS)
    # without a folder the results come back through the workers' pipes, the same objects
    assert _numbers(distributed.run_jobs(None, JOBS, train_mlp, workers=2)) == _numbers(one)


def test_the_default_is_one_worker_per_core_on_the_cpu_and_none_on_a_gpu(monkeypatch):
    monkeypatch.setitem(device._state, "device", None)  # as a fresh process: earlier tests may have configured one
    monkeypatch.delenv(workers.WORKERS_VARIABLE, raising=False)
    monkeypatch.delenv(device.THREADS_VARIABLE, raising=False)
    # this test sets torch to 2 threads below: give the next tests back the threads they had (a process forked
    # after running OpenMP on 2 threads hangs in its workers)
    threads = torch.get_num_threads()
    try:
        _default_workers_and_threads(monkeypatch)
    finally:
        torch.set_num_threads(threads)


def _default_workers_and_threads(monkeypatch):
    assert workers.count() == 1  # told nothing: this process, as before
    assert device.configure("cpu").type == "cpu" and torch.get_num_threads() == 1
    assert workers.count() == workers.cores() >= 1
    monkeypatch.setenv(workers.WORKERS_VARIABLE, "3")
    assert workers.count() == 3
    monkeypatch.setenv(workers.WORKERS_VARIABLE, "many")
    with pytest.raises(ValueError, match="DALIGN_WORKERS='many' must be a whole number"):
        workers.count()
    monkeypatch.setenv(workers.WORKERS_VARIABLE, "2")
    monkeypatch.setenv(device.THREADS_VARIABLE, "2")
    with pytest.raises(ValueError, match="choose DALIGN_WORKERS=1 for one process of 2 threads"):
        workers.count()
    monkeypatch.delenv(workers.WORKERS_VARIABLE)
    assert workers.count() == 1 and device.configure("cpu") and torch.get_num_threads() == 2  # one process of 2
    monkeypatch.delenv(device.THREADS_VARIABLE)
    # a GPU run: nothing changes (no thread setting, no workers, whatever DALIGN_WORKERS says)
    monkeypatch.setattr("dalign_core.device.resolve_device", lambda name: torch.device("cuda", 0))
    torch.set_num_threads(2)
    assert device.configure("auto").type == "cuda" and torch.get_num_threads() == 2
    monkeypatch.setenv(workers.WORKERS_VARIABLE, "4")
    assert workers.count() == 1


def test_a_job_of_several_ranks_runs_on_one_worker(tmp_path):
    wide = [Job("wide", cost=4.0, ranks=2, payload=(8, 0)), Job("narrow", payload=(4, 0))]
    seen = distributed.run_jobs(tmp_path, wide, lambda job, group: {"ranks": job.ranks, "group": group}, workers=2)
    assert seen == {"wide": {"ranks": 1, "group": None}, "narrow": {"ranks": 1, "group": None}}


# ----------------------------------------------------------------------------- failures, deaths, interruptions


def test_a_job_that_raises_is_named_with_the_workers_traceback(tmp_path):
    def compute(job, group):
        if job.name == "mlp_w8_s1":
            raise ValueError("width 8 does not fit")
        return train_mlp(job)

    with deadline(120), pytest.raises(workers.WorkerError, match="1 job\\(s\\) failed: mlp_w8_s1") as failed:
        distributed.run_jobs(tmp_path, JOBS, compute, workers=2)
    message = str(failed.value)
    assert "ValueError: width 8 does not fit" in message and "in compute" in message  # the worker's traceback
    assert [f["job"] for f in failed.value.failures] == ["mlp_w8_s1"]
    # the other jobs went on and are kept
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == sorted(j.name for j in JOBS if j.name != "mlp_w8_s1")


def test_a_killed_worker_does_not_hang_the_parent(tmp_path):
    def compute(job, group):
        if job.name == "mlp_w16_s0":
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, no message: as the out-of-memory killer does
        return train_mlp(job)

    with deadline(120), pytest.raises(workers.WorkerError, match="mlp_w16_s0") as failed:
        distributed.run_jobs(tmp_path, JOBS, compute, workers=2)
    assert "died (killed by signal 9) while computing job mlp_w16_s0" in str(failed.value)
    done = {p.stem for p in tmp_path.glob("*.json")}
    assert "mlp_w16_s0" not in done and done  # the surviving worker finished what it could
    # the same call again computes the rest
    computed = []
    again = distributed.run_jobs(tmp_path, JOBS, train_mlp, workers=2,
                                 finished=lambda job, lookup: computed.append(job.name))
    assert sorted(computed) == sorted({j.name for j in JOBS} - done) and len(again) == len(JOBS)


def test_ctrl_c_stops_the_workers_and_a_rerun_computes_only_what_is_missing(tmp_path, monkeypatch):
    # Ctrl-C must raise here even where this process was started with SIGINT ignored (a background job of a
    # non-interactive shell) or an earlier test left another handler
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_scenario(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_scenario(tmp_path):
    release = tmp_path / "release"

    def compute(job, group):
        if job.payload[0] == 4:  # the cheapest jobs come last in the plan: they wait until released
            while not release.exists():
                time.sleep(0.05)
        return train_mlp(job)

    first = []

    def interrupt():  # Ctrl-C, once the other jobs are in
        while len(first) < 4:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt, daemon=True)
    timer.start()
    with deadline(120), pytest.raises(KeyboardInterrupt, match="interrupted; rerun the same command to resume"):
        distributed.run_jobs(tmp_path / "jobs", JOBS, compute, workers=2,
                             finished=lambda job, lookup: first.append(job.name))
    timer.join()
    assert not multiprocessing.active_children()  # the workers were stopped
    assert sorted(first) == sorted(j.name for j in JOBS if j.payload[0] != 4)
    assert {p.stem for p in (tmp_path / "jobs").glob("*.json")} == set(first)
    release.touch()
    second = []
    results = distributed.run_jobs(tmp_path / "jobs", JOBS, compute, workers=2,
                                   finished=lambda job, lookup: second.append(job.name))
    assert sorted(second) == ["mlp_w4_s0", "mlp_w4_s1"]  # only the missing ones
    assert _numbers(results) == _numbers(distributed.run_jobs(None, JOBS, train_mlp, workers=1))


# ----------------------------------------------------------------------------- provenance and the sweep


@dataclass(frozen=True)
class GridConfig(ExperimentConfig):
    profile: str = "smoke"
    seed: int = 0
    device: str = "cpu"


def test_the_provenance_records_threads_and_workers(tmp_path, monkeypatch):
    def compute(config, out_dir):
        results = distributed.run_jobs(Path(out_dir) / "partial", JOBS, train_mlp)
        return {"grid": pd.DataFrame([{"job": name, **_numbers({name: r})[name]} for name, r in results.items()])}, {}

    records = {}
    for count in ("1", "2"):
        monkeypatch.setenv(workers.WORKERS_VARIABLE, count)
        out = tmp_path / count
        run_experiment("grid", ("grid",), GridConfig(), compute, out_dir=out)
        records[count] = json.loads((out / "grid.json").read_text())["hardware"]
        assert records[count]["threads_per_process"] == 1 and records[count]["workers"] == int(count)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "1" / "grid.csv"), pd.read_csv(tmp_path / "2" / "grid.csv"))


def test_the_toy_sweep_writes_the_same_tables_on_one_and_two_workers(tmp_path, monkeypatch):
    config, family = ToyConfig(widths=(8, 16, 24), seeds=2), ToyFamily()
    tables = {}
    for count in ("1", "2"):
        monkeypatch.setenv(workers.WORKERS_VARIABLE, count)
        monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / f"checkpoints{count}"))  # each trains afresh
        tables[count], _ = sweep.run_sweep(config, family, jobs=jobs_dir(tmp_path / count, config, family))
    for name, table in tables["1"].items():
        pd.testing.assert_frame_equal(table.drop(columns=["seconds"], errors="ignore"),
                                      tables["2"][name].drop(columns=["seconds"], errors="ignore"), check_exact=True)


# ---------------------------------------------------------------------------
# A parent killed with SIGKILL takes its workers with it

_ORPHAN_SCRIPT = """
import os, sys, time
from pathlib import Path
from dalign_repro.training import workers
from dalign_repro.training.distributed import Job, _Store
folder = Path(sys.argv[1])
def compute(job, group):
    (folder / f"worker-{os.getpid()}").write_text(job.name)
    time.sleep(300)
workers.run_pool([Job("a"), Job("b"), Job("c")], compute, _Store(folder / "jobs"), 2)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and forks")
@pytest.mark.parametrize("pdeathsig", [True, False], ids=["prctl", "watchdog"])
def test_workers_exit_when_their_parent_is_killed(tmp_path, monkeypatch, pdeathsig):
    """kill -9 of the sweep's process: its workers, both inside a job, end within seconds.

    The second case disables prctl (as on a platform without it): the watchdog thread alone must end them."""
    import subprocess

    importing = "from dalign_repro.training import workers"
    assert importing in _ORPHAN_SCRIPT  # the watchdog case below patches the module the script imports
    script = _ORPHAN_SCRIPT if pdeathsig else _ORPHAN_SCRIPT.replace(
        importing, f"{importing}\nworkers.PR_SET_PDEATHSIG = -1")
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        started = time.monotonic()
        while len(list(tmp_path.glob("worker-*"))) < 2:
            assert parent.poll() is None, "the sweep ended before its workers started"
            assert time.monotonic() - started < 120, "the workers did not start"
            time.sleep(0.1)
        pids = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
        assert all(_alive(pid) for pid in pids)
        parent.kill()
        parent.wait()
        killed = time.monotonic()
        while any(_alive(pid) for pid in pids) and time.monotonic() - killed < 15:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids), "a worker outlived its killed parent"
    finally:
        parent.kill()
        for p in tmp_path.glob("worker-*"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p.name.split("-")[1]), signal.SIGKILL)


# ---------------------------------------------------------------------------
# The job grid says how far it is: "job k of N" with the time taken and left


@pytest.mark.parametrize("count", [1, 2])
def test_the_grid_logs_job_k_of_n_with_the_time_left(tmp_path, caplog, count):
    import logging

    with caplog.at_level(logging.INFO), deadline(120):
        distributed.run_jobs(tmp_path / "jobs", JOBS, train_mlp, workers=count)
    lines = [r.getMessage() for r in caplog.records if " of 6 done (" in r.getMessage()]
    assert len(lines) == 6 and lines[-1].startswith("job 6 of 6 done") and "left" not in lines[-1]
    assert all("left" in line for line in lines[:-1]) and all(" in" in line for line in lines)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        distributed.run_jobs(tmp_path / "jobs", JOBS, train_mlp, workers=count)  # all kept: nothing to count
    assert not any(" of 6 done" in r.getMessage() for r in caplog.records)


def test_grid_progress_weighs_the_time_left_by_the_jobs_costs(monkeypatch):
    clock = iter([0.0, 60.0, 120.0])
    monkeypatch.setattr(workers.time, "monotonic", lambda: next(clock))
    progress = workers.GridProgress([Job("wide", cost=3.0), Job("narrow", cost=1.0)])
    assert progress.finished("wide") == "job 1 of 2 done (wide): 60 s in, about 20 s left"
    assert progress.finished("narrow") == "job 2 of 2 done (narrow): 2.0 min in"


FAMILY_BUILD_IMPORTS = """
import sys
from dalign_repro.experiments import llama_width, pythia_width, resnet_width
from dalign_repro.sweep.family import Splits
for experiment in (llama_width, pythia_width, resnet_width):
    config = experiment.Config.for_profile("smoke")
    spec = experiment.FAMILY.for_config(config)
    spec.import_modules()
    before = set(sys.modules)
    facts = {"vocab_size": 64, "num_classes": 10, "mean": (0.5,), "std": (0.25,)}  # what a build reads of the data
    spec.build(config, config.widths[0], 0, Splits(None, None, None, "examples", facts))
    print(spec.name, sorted(name for name in set(sys.modules) - before if not name.startswith("torch.")))
"""


def test_a_family_names_the_modules_its_build_imports():
    """The sweep imports a family's ``modules`` before its job grids fork: a build after that imports nothing more
    (in a fresh process, so that no other test has imported them), else every forked worker imports it again
    (transformers' model chain: about 2 s a worker, once per job grid)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", FAMILY_BUILD_IMPORTS], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["llama []", "pythia []", "resnet []"], done.stdout


WORKER_TRAINING_IMPORTS = """
import json, sys
import torch
from dalign_core import device
from dalign_repro.training import distributed

def imports_of_training(job, group=None):  # one SGD step of a linear model: what a job's training imports
    before = set(sys.modules)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return sorted(set(sys.modules) - before)

device.configure("cpu")
jobs = [distributed.Job(f"job{i}", cost=1.0, payload=i) for i in range(2)]
print(json.dumps(sorted({m for new in distributed.run_jobs(None, jobs, imports_of_training, workers=2).values()
                         for m in new})))
"""


def test_a_forked_worker_imports_nothing_to_train():
    """A pool imports what training imports before it forks (an optimizer's first param group imports
    torch._dynamo, about 900 modules): a worker's job then imports nothing, else each worker of each pool pays it
    again (1.8 s of CPU on a 2-core AVX2 EPYC). In a fresh process, so that no other test has imported it."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", WORKER_TRAINING_IMPORTS], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stdout.splitlines()[-1])
    assert not imported, f"a worker's training imported {len(imported)} modules, e.g. {imported[:3]}"
